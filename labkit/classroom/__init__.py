"""The classroom around the notebooks: learners' notebooks built from the course sources,
quizzes scored, submissions graded, defaults fitted to the machine.

``release.py`` strips solutions (nbgrader's conventions); ``quizzes.py`` reads and scores
quizzes; ``grade.py`` executes submissions and writes a CSV; ``machine.py`` picks rank counts
this machine can run one core (or GPU) each.
"""

from labkit.classroom.machine import MachineFit, fit_to_machine
from labkit.classroom.quizzes import QuizRecord, load_quiz

__all__ = ["MachineFit", "QuizRecord", "fit_to_machine", "load_quiz"]
