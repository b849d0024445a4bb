# The helper scripts under scripts/ are run as child processes, never collected as tests.
collect_ignore_glob = ["scripts/*"]
