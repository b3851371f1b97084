"""Evaluation: pure functions of records — metrics, tables, plots and gradient analyses."""
