"""``talon train-head``: train an EAGLE-3 head (:mod:`talon_sd.eagle3`) for any target, offline.

Pipeline, one module per stage, all state in one work folder so that every stage resumes::

    prompts.py   user JSONL files, Magpie requests the target writes itself, requests about local code
    data.py      the target answers them          -> <work>/data/{prompts,samples}.jsonl   (ids + loss mask)
    vocab.py     the Vd most frequent answer tokens (the draft vocabulary)
    features.py  one teacher-forced target forward per sample
                                                  -> <work>/features/shard-*.safetensors (aux features, teacher)
    ttt.py       the training-time test: k unrolled draft steps, their attention masks and loss
    trainer.py   AdamW loop, validation, checkpoints -> <work>/train/checkpoint.pt, <work>/train_log.jsonl
    cli.py       the subcommand; the head is exported with ``save_eagle3_head`` plus ``training.json``

The head is trained exactly as :class:`talon_sd.drafters.Eagle3Drafter` runs it: row t = (target
feature f_t, token x_{t+1}) predicts x_{t+2}; deeper steps feed back the head's own output hidden state.
The six benchmark prompt sets are never training data.
"""

from .data import DataConfig, Sample, build_data, read_samples
from .features import FeatureConfig, FeatureStore, write_features
from .trainer import TrainConfig, Trainer, export_head, prepare_head_for_training
from .ttt import ttt_forward, ttt_loss, ttt_visibility

__all__ = [
    "DataConfig", "FeatureConfig", "FeatureStore", "Sample", "TrainConfig", "Trainer", "build_data", "export_head",
    "prepare_head_for_training", "read_samples", "ttt_forward", "ttt_loss", "ttt_visibility", "write_features",
]
