"""The round loop of one bug: propose, screen, verify, feed back.

:func:`~.loop.heal` knows no pytest hook, no rerun and no verification internals: it
takes a fixer, a screen (:mod:`.guards`) and a verify callable, and returns a
:class:`~.outcomes.HealResult`.
"""
