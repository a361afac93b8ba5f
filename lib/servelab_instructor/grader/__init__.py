"""The batch grader: every student's exercise notebooks run on hidden cases from a secret seed.

``SERVELAB_GRADE_SEED=N python -m servelab_instructor.grader grade SUBMISSIONS_DIR --out grades.csv``.
Each student's code runs in an isolated worker (:mod:`~servelab_instructor.grader.sandbox`, the worker's
own text :mod:`~servelab_instructor.grader._worker`, stray processes reaped by
:mod:`~servelab_instructor.grader.reaper`); :mod:`~servelab_instructor.grader.extract` reads the graded
definitions out of a notebook, :mod:`~servelab_instructor.grader.submissions` finds the notebooks,
:mod:`~servelab_instructor.grader.grade` runs the checkers of :mod:`servelab.exercises` on them and
:mod:`~servelab_instructor.grader.lms` writes the sheet and the feedback. Instructor-only: not in the wheel.
"""
