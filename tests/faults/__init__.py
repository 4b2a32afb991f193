"""Fault injection: histories of critical sections under a nemesis, and their checker."""
