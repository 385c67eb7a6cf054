"""Judge my_trainer.py's training step with ppo-ref's step tier (spec STEP-1..8), through the kit.

Run, in the directory that holds this file and my_trainer.py (ppo-ref installed with its
``conformance`` and ``trainer`` extras):
python -m pytest --pyargs ppo_ref_conformance.test_step_tier --impl=my_step_runner:make_adapter
"""

import my_trainer
import torch
from my_ppo_adapter import MyAdapter

from ppo_ref.adapters.step import StepResult
from ppo_ref.adapters.step_kit import check_run, gradient_of, padded, step_result, tiny_config, tiny_model


def _batch(batch, pad_to=None, pad_fill=None):
    """The suite's batch as my_trainer reads it (prompts left-padded, completions right-padded)."""
    layout = padded(batch, pad_to, pad_fill)
    return {
        "prompt_ids": layout.prompt_ids,
        "prompt_mask": layout.prompt_mask,
        "response_ids": layout.response_ids,
        "response_mask": layout.response_mask,
        "scores": torch.tensor(batch.scores),
    }


class MyTrainerStep:
    name, version, loss_modes, micro_batch_local = "my-trainer", "0.1", ("token-mean",), {}
    provenance = (
        "my_trainer.train_step (micro-batches, optimizer.step); outputs: my_trainer.prepare's loss mask"
    )

    def __init__(self, family="gpt2"):
        self.family = family  # the tiny model's family; STEP-7 asks for the other position scheme's

    def with_family(self, family):
        return MyTrainerStep(family)

    def run(self, batch, *, loss_mode, micro_batches=1, pad_to=None, pad_fill=None):
        check_run(batch, loss_mode, self.loss_modes, micro_batches, pad_to, pad_fill)
        model = tiny_model(tiny_config(self.family, batch.vocab_size), seed=0)
        seen = {}

        class ReadGradient(torch.optim.SGD):  # the gradient the step applies, read before it does
            def step(self, closure=None):
                seen["gradient"] = gradient_of(model.named_parameters())
                return super().step(closure)

        stats = my_trainer.train_step(
            model, ReadGradient(model.parameters(), lr=1.0), _batch(batch, pad_to, pad_fill),
            batch.group_size, batch.size // micro_batches, batch.eos_id,
        )  # fmt: skip
        return step_result(seen["gradient"], stats["losses"], stats, {"loss_mask": stats["loss_mask"]})

    def truncation_run(self, batch):
        """my_trainer's loss mask with its overlong filtering on: rows it leaves out are truncated."""
        loss_mask, _ = my_trainer.prepare(_batch(batch), batch.eos_id, mask_truncated=True)
        return StepResult(gradient={}, loss=0.0, outputs={"loss_mask": loss_mask})


class MyAdapterWithStep(MyAdapter):
    step = MyTrainerStep()


def make_adapter():
    return MyAdapterWithStep()
