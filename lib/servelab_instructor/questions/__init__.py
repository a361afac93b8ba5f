"""Assignments from the question bank (:mod:`servelab.questions`): student version and answer key.

``python -m servelab_instructor.questions export --tiers L1,L2 --format notebook --out DIR``
(:mod:`~servelab_instructor.questions.export`). Instructor-only: not in the wheel.
"""
