"""Explain: turn a record into words and pictures for people.

`breakdown` (weights, optimizer state, working memory), `report` (the
summary), `plot`, and out-of-memory forensics (`guard`).
"""
