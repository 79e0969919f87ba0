"""Running a sweep: one job end to end with its outcome (record), its rounds (rounds), a search over settings
(search), and SIGTERM/SIGINT as a killed job (signals)."""
