"""verl-step-norm-width (latent): the Dr. GRPO normaliser of ``seq-mean-token-sum-norm`` is the batch's
padded response width.

Interpreter: .envs/verl/bin/python (run from the repository root:
``.envs/verl/bin/python findings/repro/verl-step-norm-width.py``). Needs only ``pip install verl==0.9.1``
(with its dependencies torch, transformers, tensordict, omegaconf, numpy); imports nothing else.

What it drives: one actor update of verl 0.9.1's trainer, ``RayPPOTrainer._compute_old_log_prob`` and
``RayPPOTrainer._update_actor`` with this process's ``TrainingWorker`` as the actor worker group
(``infer_batch`` / ``train_mini_batch`` -> ``FSDPEngine.forward_backward_batch``,
``left_right_2_no_padding``, ``workers/utils/losses.ppo_loss`` -> the ``vanilla`` policy loss and
``agg_loss``), FSDP2 over a gloo group of one, fp32, a tiny Qwen2 built from a config. Scores placed by
``RewardManagerBase.assemble_rm_scores`` (the reward loop's placement), advantages by
``ray_trainer.compute_advantage`` (GRPO). The gradient is read at ``optimizer_step``.

Setting that triggers it: ``actor.loss_agg_mode: seq-mean-token-sum-norm`` with ``actor.loss_scale_factor``
null (its default), on a batch whose responses are padded WIDER than ``rollout.response_length``.
``agg_loss`` (``trainer/ppo/core_algos.py``) divides by ``loss_mask.shape[-1]``, and ``ppo_loss`` rebuilds
that mask with ``no_padding_2_padding`` at the batch's padded response width. Why latent: verl's own
pipeline pads every response to exactly ``rollout.response_length`` (``experimental/agent_loop/
agent_loop.py``, ``_pad_token_ids(output.response_ids, max_length=rollout_config.response_length)``), so
there the width IS the configured response length, the constant the Dr. GRPO paper prescribes, and
verl PR #5417 kept that default on purpose. Only a batch that verl's rollout did not build (a custom
generator or data padded to another width) sees it. Also run: the same width change with
``loss_scale_factor: 6`` (the documented remedy) and with verl's default mode ``token-mean``.

Expected (hand-computable, ratio 1 at step 0 so the vanilla loss is ``-A`` per token): with the constant
normaliser L = rollout.response_length = 6, loss = -sum_i n_i A_i / (B L) at every padded width (n_i the
response's tokens, A_i its GRPO advantage (s_i - mean_g) / (std_g + 1e-6), unbiased std), and the
gradient unchanged by the padding; token-mean: -sum_i n_i A_i / sum_i n_i. Got at the trigger: responses
padded to 9 columns divide the loss and the gradient by 9 instead of 6 (ratio 2/3).

Exit status: 1 when the padded batch's loss or gradient differs from the unpadded one (relative > 1e-5)
at the trigger; 0 otherwise.

Stand-ins (no GPU, no Ray): verl's CUDA platform subclassed with the CPU's device name, registered
through ``verl.plugin.platform.platform_manager.set_platform``; ``VERL_ENGINE_DEVICE=cuda`` so
``EngineRegistry`` picks the FSDP engine registered for CUDA; the TrainingWorker's methods on an instance
built without Ray. None changes the loss or its normaliser.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import warnings
from functools import partial
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")

import numpy as np  # noqa: E402
import torch  # noqa: E402

PAD, EOS, VOCAB, BUDGET = 0, 1, 16, 6
PROMPTS = [[2, 3, 4, 5, 6, 7, 8, 9, 10], [2, 11, 12, 13, 14, 15, 3, 4, 5]]
RESPONSES = [  # 2 prompts x 4 responses; EOS = 1 ends a finished one, rows 2 and 7 are cut at the budget
    [6, 7, 8, 9, 10, 1],
    [11, 1],
    [12, 13, 14, 15, 3, 4],
    [5, 6, 7, 1],
    [1],
    [8, 9, 10, 1],
    [11, 12, 13, 14, 1],
    [15, 3, 4, 5, 6, 7],
]
SCORES = [1.0, 0.0, 0.5, -1.0, 0.25, 1.5, -0.5, 0.0]
GROUP = 4


def cpu_platform():
    """verl's CUDA platform with the CPU's device name and module (verl ships CUDA, NPU and ROCm
    platforms only); registered through verl's own ``set_platform``. It changes where tensors live."""
    from verl.plugin.platform.platform_cuda import PlatformCUDA

    class Device:
        def __getattr__(self, name):
            if hasattr(torch.cpu, name):
                return getattr(torch.cpu, name)
            if name == "get_device_name":
                return lambda *a, **k: "CPU"
            if name == "mem_get_info":
                return lambda *a, **k: (0, 0)
            if "memory" in name:
                return lambda *a, **k: 0
            raise AttributeError(name)

    class PlatformCPU(PlatformCUDA):
        device_name = property(lambda self: "cpu")
        vendor_name = property(lambda self: "cpu")
        device_module = property(lambda self: Device())

        def is_available(self):
            return True

        def current_device(self):
            return "cpu"

        def device_count(self):
            return 1

        def set_device(self, device_index):
            return None

        def synchronize(self, device_index=None):
            return None

        def manual_seed(self, seed):
            torch.manual_seed(seed)

        def manual_seed_all(self, seed):
            torch.manual_seed(seed)

        def empty_cache(self):
            return None

        def communication_backend_name(self):
            return "gloo"

    return PlatformCPU()


def setup_process():
    """A gloo process group of world size 1 and the CPU platform."""
    import torch.distributed as dist
    from verl.plugin.platform import platform_manager

    os.environ["VERL_ENGINE_DEVICE"] = "cuda"
    if platform_manager.get_platform().device_name != "cpu":
        platform_manager.set_platform(cpu_platform())
    if not dist.is_initialized():
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "LOCAL_RANK": "0"}
        for key, value in {**env, "WORLD_SIZE": "1"}.items():
            os.environ.setdefault(key, value)
        dist.init_process_group("gloo", rank=0, world_size=1)


def save_tiny_qwen2(directory, seed=0):
    """A tiny Qwen2 (2 layers, width 32, random weights) and a word-level tokenizer, built in-process."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config

    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attention_dropout=0.0,
        tie_word_embeddings=False,
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=2,
    )
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(directory)
    words = {"<pad>": PAD, "<eos>": EOS, "<bos>": 2, **{f"t{i}": i for i in range(3, VOCAB)}}
    core = Tokenizer(WordLevel(words, unk_token="<bos>"))
    core.pre_tokenizer = WhitespaceSplit()
    PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="<bos>"
    ).save_pretrained(directory)
    return directory


class Profiler:  # what TrainingWorker reads of its profiler (disabled)
    rank = 0

    def check_enable(self):
        return False

    def step(self):
        return None


def make_worker(path, actor_settings):
    """verl's TrainingWorker (its methods on an instance built without Ray) around an initialised
    FSDPEngineWithLMHead (FSDP2, no padding removal: the path without flash-attn) and ``ppo_loss``."""
    from verl.trainer.config import CheckpointConfig
    from verl.utils.flops_counter import FlopsCounter
    from verl.workers.config import ActorConfig, FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
    from verl.workers.engine import EngineRegistry
    from verl.workers.engine_workers import TrainingWorker
    from verl.workers.utils.losses import ppo_loss

    setup_process()
    rows = len(RESPONSES)
    model_config = HFModelConfig(
        path=path,
        use_remove_padding=False,
        enable_gradient_checkpointing=False,
        override_config={"attn_implementation": "eager"},
    )
    engine_config = FSDPEngineConfig(
        strategy="fsdp2",
        use_dynamic_bsz=False,
        micro_batch_size_per_gpu=rows,
        infer_micro_batch_size_per_gpu=rows,
        mixed_precision={"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"},
        use_torch_compile=False,
        use_remove_padding=False,
        seed=0,
    )
    optimizer_config = FSDPOptimizerConfig(
        lr=1.0, optimizer="SGD", weight_decay=0.0, clip_grad=1e30, total_training_steps=1
    )
    model_config.model_type = "language_model"
    engine = EngineRegistry.new(
        model_type="language_model",
        backend="fsdp2",
        model_config=model_config,
        engine_config=engine_config,
        optimizer_config=optimizer_config,
        checkpoint_config=CheckpointConfig(),
    )
    engine.initialize()
    actor_config = ActorConfig(
        strategy="fsdp",
        rollout_n=GROUP,
        ppo_mini_batch_size=rows // GROUP,
        ppo_micro_batch_size_per_gpu=rows,
        use_torch_compile=False,
        **actor_settings,
    )
    worker = object.__new__(TrainingWorker)
    worker.__dict__.update(
        config=SimpleNamespace(model_type="language_model"),
        model_config=model_config,
        engine_config=engine_config,
        optimizer_config=optimizer_config,
        engine=engine,
        device_name="cpu",
        flops_counter=FlopsCounter(model_config.hf_config),
        profiler=Profiler(),
        loss_fn=partial(ppo_loss, config=actor_config),
    )
    return worker


def rollout_batch(response_width):
    """The batch as verl's agent loop hands it to the trainer (left-padded prompts, responses
    right-padded to ``response_width``, attention mask, position ids, uid per group)."""
    from verl import DataProto
    from verl.utils.model import compute_position_id_with_mask

    rows, width_p = len(RESPONSES), max(len(p) for p in PROMPTS)
    prompt_ids = torch.full((rows, width_p), PAD)
    prompt_mask = torch.zeros((rows, width_p), dtype=torch.long)
    response_ids = torch.full((rows, response_width), PAD)
    response_mask = torch.zeros((rows, response_width), dtype=torch.long)
    for i, response in enumerate(RESPONSES):
        prompt = PROMPTS[i // GROUP]
        prompt_ids[i, width_p - len(prompt) :] = torch.tensor(prompt)
        prompt_mask[i, width_p - len(prompt) :] = 1
        response_ids[i, : len(response)] = torch.tensor(response)
        response_mask[i, : len(response)] = 1
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    return DataProto.from_dict(
        tensors={
            "prompts": prompt_ids,
            "responses": response_ids,
            "input_ids": torch.cat([prompt_ids, response_ids], 1),
            "attention_mask": attention_mask,
            "position_ids": compute_position_id_with_mask(attention_mask),
        },
        non_tensors={"uid": np.array([f"g{i // GROUP}" for i in range(rows)], dtype=object)},
    )


def actor_update(path, response_width, actor_settings):
    """One actor update of verl's trainer on the batch padded to ``response_width``: (loss, gradient)."""
    from omegaconf import OmegaConf
    from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase
    from verl.trainer.ppo.core_algos import AdvantageEstimator
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer, compute_advantage, compute_response_mask

    worker = make_worker(path, actor_settings)
    record = {"losses": []}
    loss_fn = worker.loss_fn

    def loss(model_output, data, dp_group=None):  # records the loss verl's backward takes
        value, metrics = loss_fn(model_output=model_output, data=data, dp_group=dp_group)
        if torch.is_grad_enabled():
            record["losses"].append(float(value.detach()))
        return value, metrics

    worker.loss_fn = loss
    engine, step = worker.engine, worker.engine.optimizer_step

    def optimizer_step():  # the gradient verl's optimizer is about to apply
        grads = {}
        for name, parameter in engine.module.named_parameters():
            grad = parameter.grad
            grad = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
            grads[name] = grad.detach().double().clone()
        record["gradient"] = grads
        return step()

    engine.optimizer_step = optimizer_step

    class Group:  # the actor worker group, in this process
        def compute_log_prob(self, td):
            return worker.infer_batch(td)

        def update_actor(self, td):
            return worker.train_mini_batch(td)

    config = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {"n": GROUP, "temperature": 1.0, "multi_turn": {"enable": False}},
                "actor": {
                    "calculate_entropy": False,
                    "entropy_coeff": 0.0,
                    "calculate_sum_pi_squared": False,
                    "ppo_mini_batch_size": len(RESPONSES) // GROUP,
                    "ppo_epochs": 1,
                    "data_loader_seed": 0,
                    "shuffle": False,
                },
            }
        }
    )
    trainer = SimpleNamespace(config=config, actor_rollout_wg=Group(), distillation_config=None)
    data = rollout_batch(response_width)
    rewards = RewardManagerBase.assemble_rm_scores(data, SCORES)
    data.batch["token_level_scores"] = rewards
    data.batch["token_level_rewards"] = rewards
    data.batch["response_mask"] = compute_response_mask(data)
    data.meta_info["temperature"] = 1.0
    data.meta_info["global_token_num"] = data.batch["attention_mask"].sum(-1).tolist()
    old, _ = RayPPOTrainer._compute_old_log_prob(trainer, data)
    data = data.union(old)
    data = compute_advantage(data, adv_estimator=AdvantageEstimator.GRPO, num_repeat=GROUP)
    RayPPOTrainer._update_actor(trainer, data)
    return sum(record["losses"]), record["gradient"]


def expected_loss(mode, normaliser):
    """The step-0 loss from the formula (ratio 1: the vanilla loss is -A per token), plain torch."""
    scores = torch.tensor(SCORES, dtype=torch.float64).view(-1, GROUP)
    adv = ((scores - scores.mean(1, keepdim=True)) / (scores.std(1, keepdim=True) + 1e-6)).flatten()
    tokens = torch.tensor([len(r) for r in RESPONSES], dtype=torch.float64)
    if mode == "token-mean":
        return float(-(tokens * adv).sum() / tokens.sum())
    return float(-(tokens * adv).sum() / (len(RESPONSES) * normaliser))


def relative_difference(first, second):
    diff = max(float((first[k] - second[k]).abs().max()) for k in first)
    return diff / max(float(g.abs().max()) for g in first.values())


def main():
    import transformers
    import verl

    print(
        f"verl {verl.__version__}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"python {sys.version.split()[0]}; rollout.response_length = {BUDGET} (verl's agent loop pads to it)"
    )
    wrong = False
    norm = "seq-mean-token-sum-norm"
    runs = (
        (f"trigger: {norm}, loss_scale_factor null (default)", norm, None),
        (f"{norm}, loss_scale_factor 6 (the remedy)", norm, 6),
        ("default: token-mean", "token-mean", None),
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = save_tiny_qwen2(tmp)
        for label, mode, factor in runs:
            settings = {"loss_agg_mode": mode, "loss_scale_factor": factor}
            expected = expected_loss(mode, BUDGET)
            loss6, grad6 = actor_update(path, BUDGET, settings)
            loss9, grad9 = actor_update(path, 9, settings)
            moved = relative_difference(grad6, grad9)
            print(
                f"{label}: loss: expected {expected:.5f} at widths 6 and 9, got {loss6:.5f} (width 6) and "
                f"{loss9:.5f} (width 9); gradient width 9 vs 6: expected relative difference 0, got "
                f"{moved:.4f}"
            )
            if factor is None and mode == norm:
                wrong = moved > 1e-5 or abs(loss9 - expected) > 1e-5 * max(1.0, abs(expected))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
