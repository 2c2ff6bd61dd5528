"""Where the fault may be, and what a fixer is shown of it.

:mod:`.grouping` turns failures into bugs; :mod:`.reach` follows the project's imports
from what the test run recorded; :mod:`.context` builds the one view a fixer gets
(:func:`~.context.build_context`), focused by :mod:`.outline`; :mod:`.need` answers a
model's request for more code.
"""
