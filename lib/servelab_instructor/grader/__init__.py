"""The batch grader: every student's exercise notebooks run on hidden cases from a secret seed.

``SERVELAB_GRADE_SEED=N python -m servelab_instructor.grader grade SUBMISSIONS_DIR --out
grades.csv``. Each student's code runs in an isolated worker (:mod:`~.sandbox`, the worker's own
text :mod:`~._worker`, stray processes reaped by :mod:`~.reaper`); :mod:`~.extract` reads the
graded definitions out of a notebook, :mod:`~.submissions` finds the notebooks, :mod:`~.grade` runs
the checkers of :mod:`servelab.exercises` on them and :mod:`~.lms` writes the sheet and the
feedback. Instructor-only: not in the wheel.
"""
