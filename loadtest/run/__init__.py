"""Running a load test: sending a workload on its schedule and collecting what came back."""
