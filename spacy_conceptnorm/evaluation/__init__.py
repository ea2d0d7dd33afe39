"""Scoring and corpus reading for linking evaluation."""
