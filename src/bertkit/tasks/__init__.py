"""Fine-tuning tasks: readers -> features (task.py: the typed stages and the Task protocol) -> model + head -> the
shared training loop -> metrics. registry.py names every task (`--task NAME`); runner.py is the one fine-tuning
driver and evaluate / predict; data.py builds the real task data sets.
"""
