"""The session: from captured failures to written outputs.

:class:`~.controller.HealingController` is registered where reports arrive (a plain
session or the xdist controller); at the end of the run it hands the failures to
:func:`~.pipeline.run_healing`, which checks nothing of pytest: it groups the failures
into bugs, heals each (:func:`~.bug.heal_bug`; in parallel where they share no file,
:mod:`.schedule`) and makes the report (:func:`~.finish.finish`), which the controller
publishes.
"""
