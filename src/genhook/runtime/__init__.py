"""The process runtime: the roles a process runs, the supervisor of ``genhook serve``, the
lifeline every supervised child starts through, the services a role opens, and the wake-ups
that carry news of claimable work between processes.

Nothing is imported here: ``python -m genhook.runtime.supervisor`` runs with the standard
library only, and each role imports just what it needs.
"""
