"""Certification of a partition against reference figures: suite, figures, verdicts, certificate."""
