"""Planted bugs for the suite's meta-tests: each is a reference impl with one small defect,
reached with `--impl=conformance.planted.bugs:<NAME>` exactly as an outside backend would be."""
