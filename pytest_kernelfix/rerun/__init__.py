"""Rerunning a few tests in a sandbox copy, in a child process, and reading back a
typed report.

The session side: :mod:`.plan` (what the child is told), :mod:`.runner` (the one entry
point, :func:`~.runner.run_tests`, and the session's :class:`~.runner.Reruns`),
:mod:`.phased` (every child: it collects once and runs phases), :mod:`.launcher` (how a
child process starts), :mod:`.sandbox` (the disposable copy) and :mod:`.server` (the warm
fork server). The child side: :mod:`.child` (the agent, its phases loop and its import
mapping) and :mod:`.probes` (integrity, poisoning and the GPU compile gate, which run
inside the child). Importing this package imports nothing: the child reads its plan before
anything else.
"""
