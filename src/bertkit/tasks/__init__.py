"""Fine-tuning tasks: readers -> features (task.py) -> head -> the shared loop -> metrics; registry.py names them,
runner.py drives them, data.py builds the real data sets.
"""
