"""Reading an output back for people: stats queries, report, inspect, check-template."""
