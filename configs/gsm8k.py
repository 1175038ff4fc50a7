"""DERL on GSM8K (and the MATH+GSM8K mixture, tested on GSM8K) with a Qwen2.5 policy.

The same fields and paper settings as configs/math.py (see its docstring); only the data
differ. Presets (`--config=configs/gsm8k.py:<preset>`):

  default  train on GSM8K, test on GSM8K:

      python launch/run.py --config=configs/gsm8k.py --mode=search --workdir=runs/gsm8k \\
          --config.policy.checkpoint=/models/Qwen2.5-3B \\
          --config.meta.hf_path=/models/Qwen2.5-0.5B-Instruct \\
          --config.data.train=gsm8k:/data/gsm8k/train.jsonl --config.data.test=gsm8k:/data/gsm8k/test.jsonl

           Rough time: as configs/math.py (an inner run is bounded by the 3.5-hour limit on
           one H200; the 7,473 GSM8K training problems give about 94 steps per epoch of the inner-training split at
           64 prompts per step).

  mixture  trained on MATH + GSM8K, tested on GSM8K.

  tiny     the pipeline on this CPU in about a minute (GSM8K-format tiny files):

      python -m derl_jax.domains.math --write_tiny_data=/tmp/derl_math_tiny
      python launch/run.py --config=configs/gsm8k.py:tiny --mode=compare --workdir=runs/gsm8k_tiny
"""

from __future__ import annotations

import ml_collections

from configs import math as math_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """The config of preset `arg`: "default" (None or empty), "mixture" or "tiny"."""
    return math_config.build(arg, test_source="gsm8k")
