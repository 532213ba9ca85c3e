"""Fine-tuning tasks: readers -> features -> model + head -> the shared training loop -> metrics.

    task.py      the typed stages: Feature (a dataclass) and the Task protocol
    registry.py  every task by name (`--task NAME`)
    readers.py   CSV / TSV / JSONL (text, text_pair, label), CoNLL, SQuAD v1.1/v2.0; LabelMap
    metrics.py   accuracy, F1, MCC, Pearson/Spearman, entity P/R/F1 (seqeval conventions), SQuAD EM/F1
    batching.py  length-bucketed batches with dynamic padding; sorted inference
    classify.py  classify / pair / regress / multilabel on the pooled [CLS]
    tag.py       token classification (first-piece labels, windows, word and character spans)
    qa.py        SQuAD features (doc stride), n-best decoding, SQuAD 2.0 null threshold
    features.py  feature-based use: frozen encoder, combined layers, a small probe on top
    runner.py    run (the one fine-tuning driver), finetune / evaluate / predict (seeds, grid, best on dev)
    data.py      the real task data sets built from bertkit.datasets
"""
