"""skyrl-6, its precision part (latent: bf16 results only outside CUDA autocast, e.g. on a CPU): bf16
logits give bf16 log-probs without flash-attn, and the entropy is returned in bf16 on every path.

Run from the repository root: ``.envs/skyrl/bin/python findings/repro/skyrl-6.py``
(standalone: ``pip install --no-deps --ignore-requires-python skyrl==0.4.0`` plus the top-level imports
``tools/thirdparty_envs.py``'s recipe ``skyrl`` lists, without flash-attn; imports only torch,
typing_extensions, transformers and skyrl).

Drives skyrl 0.4.0's own ``HFModelWrapper.forward`` (skyrl/backends/skyrl_train/workers/model_wrapper.py:304,
what ``PolicyWorkerBase.forward_backward`` calls as ``self.model(...)``) with ``return_output=True,
compute_entropy=True`` on tiny Qwen2 and Llama models built from configs in bfloat16 (the dtype the
policy computes in under the default ``trainer.bf16: true``), ``remove_microbatch_padding=False``
(padding removal needs flash-attn's ``unpad_input``). The wrapper passes the logits, not up-cast, to
``torch_utils.logprobs_from_logits`` (torch_utils.py:115), which uses flash-attn's kernel only for CUDA
tensors and otherwise ``logprobs_from_logits_v2``, whose bf16 branch runs ``log_softmax`` on the bf16
logits (torch_utils.py:159). ``chunked_entropy_from_logits`` (torch_utils.py:58) allocates its output in
the logits' dtype.

Where it matters: skyrl's workers run every forward inside ``torch.autocast(dtype=torch.bfloat16,
device_type="cuda")`` (worker.py:1126, 1406, 1483), and CUDA autocast runs ``log_softmax``, ``exp`` and
``sum`` in float32 (torch's ``AT_FORALL_FP32`` / ``AT_FORALL_FP32_SET_OPT_DTYPE`` lists in
``ATen/autocast_mode.h``): on skyrl's GPUs the log-probs are float32 math with or without flash-attn,
and the entropy is float32 math stored in a bf16 tensor (rounding only). This script runs on a CPU,
where CUDA autocast is off (the worker warns "Disabling autocast"), i.e. outside skyrl's training path.

Expected (spec LOGP-3: float32 math on the same bf16 logits): log_softmax(logits.float()) gathered,
float32, error ~1e-7. Got on the CPU: bfloat16, max |error| about 0.03 (printed per model). Exit 1 when
the log-probs come back in bf16 with an error above 1e-3.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
import typing
from typing import Any

import torch
import typing_extensions


# ---- stand-in for flash-attn (inlined): model_wrapper.py:13 imports ``pad_input`` / ``unpad_input`` from
# ``flash_attn.bert_padding`` at top level; they are used only with ``remove_microbatch_padding``, which
# this script turns off. Only these two module names are supplied, so flash-attn's cross-entropy kernel
# still fails to import, as on a machine without flash-attn. A finder at the END of
# sys.meta_path: an installed flash-attn always wins (then the script measures the flash-attn path).
class _NoFlashAttn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    NAMES = ("flash_attn", "flash_attn.bert_padding")

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        return importlib.machinery.ModuleSpec(name, self, is_package=True) if name in self.NAMES else None

    def create_module(self, spec: Any) -> Any:
        module = types.ModuleType(spec.name)
        module.__path__ = []  # type: ignore[attr-defined]
        module.pad_input = module.unpad_input = None  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: Any) -> None:
        return None


sys.meta_path.append(_NoFlashAttn())

# skyrl 0.4.0 declares Python >=3.12. On 3.11 ``skyrl/backends/__init__.py`` fails in pydantic ("Please
# use `typing_extensions.TypedDict` instead of `typing.TypedDict` on Python < 3.12",
# ``skyrl/tinker/types.py``): import that module with ``typing.TypedDict`` bound to
# ``typing_extensions.TypedDict`` (what Python 3.12's is), then restore it. No skyrl code is changed.
_td = typing.TypedDict
typing.TypedDict = typing_extensions.TypedDict  # type: ignore[misc]
try:
    import skyrl.tinker.types  # noqa: F401
finally:
    typing.TypedDict = _td  # type: ignore[misc]

from skyrl.backends.skyrl_train.workers.model_wrapper import HFModelWrapper  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM  # noqa: E402

SMALL = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)


def main() -> None:
    wrong = False
    for name, config, cls in (
        ("Qwen2", Qwen2Config(**SMALL), Qwen2ForCausalLM),
        ("Llama", LlamaConfig(**SMALL), LlamaForCausalLM),
    ):
        torch.manual_seed(0)
        model = cls(config).to(torch.bfloat16).eval()
        wrapper = HFModelWrapper(model, remove_microbatch_padding=False)
        sequences = torch.randint(0, SMALL["vocab_size"], (4, 24))
        attention_mask = torch.ones_like(sequences)
        num_actions = 16
        with torch.no_grad():
            got, output = wrapper(
                sequences,
                num_actions,
                attention_mask=attention_mask,
                return_output=True,
                compute_entropy=True,
            )
            # the same forward (position ids as the wrapper builds them), log_softmax in float32
            position_ids = attention_mask.long().cumsum(-1) - 1
            logits = model(sequences, attention_mask=attention_mask, position_ids=position_ids).logits.float()
        logp = torch.log_softmax(logits, -1)
        labels = torch.roll(sequences, shifts=-1, dims=1)
        exact = logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)[:, -num_actions - 1 : -1]
        entropy = -(logp.exp() * logp).sum(-1)[:, -num_actions - 1 : -1]
        err = (got.float() - exact).abs()
        ent_err = (output["entropy"][:, -num_actions - 1 : -1].float() - entropy).abs()
        print(
            f"{name}: log-probs expected float32, error ~1e-7; got {got.dtype}, max |error| {err.max():.4g}, "
            f"mean {err.mean():.4g}"
        )
        print(
            f"{name}: entropy expected float32; got {output['entropy'].dtype}, "
            f"max |error| {ent_err.max():.4g}"
        )
        wrong = wrong or (got.dtype != torch.float32 and err.max().item() > 1e-3)
    print(
        "bf16 log-probs (skyrl-6 reproduces)" if wrong else "float32 log-probs (fixed, or flash-attn present)"
    )
    sys.exit(1 if wrong else 0)


if __name__ == "__main__":
    main()
