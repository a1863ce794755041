"""Running a check: the pytest plugin and its recorder, fuzz, dispatch to the single-process or
distributed checker, selection (and changed_since: --changed-since), the locked output folder, in-flight
bookkeeping, bisect and the audit command.
Imports everything below it (properties, distributed_tests, report, catalog, core); only cli imports it.
"""
