"""Instructor-only companion of ``servelab``: the exercises' reference solutions.

It lives beside ``servelab`` in ``lib/`` of the course repository, but the package discovery of
``pyproject.toml`` names ``servelab`` only, so the wheel a student installs does not contain it. In
a checkout it is importable after ``make setup`` (the editable install puts ``lib/`` on the path) or
with ``PYTHONPATH=lib``.

* :mod:`servelab_instructor.reference` -- the reference solutions the grader's hidden cases use.
* :mod:`servelab_instructor.public_expected` -- writes (``python -m
  servelab_instructor.public_expected``) and checks (``--check``) the public cases' expected values
  committed in the student package.
* :mod:`servelab_instructor.solutions` -- every exercise's solution under the student's interface.
* :mod:`servelab_instructor.gradescope` -- writes Gradescope's ``autograder.zip`` (``python -m
  servelab_instructor.gradescope build``) and grades one submission inside it (``run``).
"""
