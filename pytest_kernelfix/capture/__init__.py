"""The test side: what a test run records for healing.

Registered wherever tests run (a plain session or an xdist worker), :mod:`.plugin`
records the Triton kernels each test launches (:mod:`.launches`) and what went wrong
(:mod:`.errors`) onto the report as JSON primitives; :mod:`.records` turns them back into
:class:`~.records.Failure` and :class:`~.records.PassedTest` where reports arrive.
"""
