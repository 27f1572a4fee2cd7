"""The classroom around the notebooks: learners' notebooks built from the course sources,
quizzes scored, submissions graded, defaults fitted to the machine.

``release.py`` strips solutions (nbgrader's conventions); ``quizzes.py`` reads and scores
quizzes; ``grade.py`` grades submissions into a CSV: ``sources.py`` says what runs,
``checker.py`` runs it and computes the verdicts (``answers.py``: the learner's cells, on the
ranks only), ``verdicts.py`` starts it in a ``sandbox.py`` (with a ``cgroup.py``) and collects
its findings; ``machine.py`` picks rank counts this machine can run one core (or GPU) each.
``site.py`` builds the course's web site (``python -m labkit docs``), each lesson's page made
by ``lesson_pages.py`` (its widgets by ``widget_snapshots.py``).
"""

from labkit.lessons.show.quizzes import QuizRecord, load_quiz
from labkit.runtime.cluster.machine import MachineFit, fit_to_machine

__all__ = ["MachineFit", "QuizRecord", "fit_to_machine", "load_quiz"]
