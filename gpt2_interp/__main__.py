"""``python -m gpt2_interp …`` — the command line; under ``torchrun --nproc-per-node N -m gpt2_interp …``
the data loops (stats, evaluate-edits, trace --dataset …) run sharded over the ranks."""

import sys

from .cli import main

sys.exit(main())
