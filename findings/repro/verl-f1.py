"""verl-f1: the k3 (``low_var_kl``) KL loss has no gradient on tokens where k3 > 10 (non-default).

Interpreter: .envs/verl/bin/python (run from the repository root:
``.envs/verl/bin/python findings/repro/verl-f1.py``). Needs only ``pip install verl==0.9.1`` (with its
dependencies torch, transformers, tensordict, omegaconf); imports nothing else.

What it drives: verl 0.9.1's trainer methods ``RayPPOTrainer._compute_old_log_prob``, ``compute_advantage``
(GRPO) and ``RayPPOTrainer._update_actor`` with this process's ``TrainingWorker`` as the actor worker group:
``FSDPEngine.train_batch`` -> ``forward_step`` -> ``verl/workers/utils/losses.py ppo_loss``, which with
``actor.use_kl_loss`` adds ``kl_loss_coef * agg_loss(kl_penalty(log_prob, ref_log_prob, kl_loss_type))``.
``kl_penalty_forward`` (``core_algos.py:2239-2245``) clamps k3 to [-10, 10], so a token whose log-prob is
more than ~2.6 nats below the reference's (k3 = e^d - d - 1 > 10 at d > 2.56) contributes no gradient.
A tiny Qwen2 is built from a config; FSDP2 over a gloo group of one, fp32; SGD.

Trigger: ``actor.use_kl_loss: true`` with its default ``kl_loss_type: low_var_kl`` (the GRPO examples'
setting), two tokens 3 nats below the reference. Also runs the same setting with every token 0.3 nats
below (no clamp: equal), the workaround ``kl_loss_type: low_var_kl+`` (value still clamped, gradient
k2's, checked against d/dtheta of 0.5 (logp - ref)^2) and verl's default ``use_kl_loss: false`` (no KL
term: nothing to clamp).
All scores are equal, so GRPO's advantages are 0 and the whole gradient is the KL term's.

Expected: the gradient of kl_loss_coef * (1/N) sum_t [exp(ref_t - logp_t) - (ref_t - logp_t) - 1]
(Schulman's k3, spec KLL-1; d/d logp_t = (1 - exp(ref_t - logp_t)) / N), computed inline on a plain
transformers copy of the same weights. Got at the trigger: kl_loss 10 instead of 16.09 on those tokens and a
gradient whose relative error is of order 1 (those tokens' terms, -19.1/N each, are missing).

Exit status: 1 when verl's gradient differs from the formula's by more than 1e-3 (relative) at the trigger.

Stand-ins (no GPU, no Ray): verl's CUDA platform subclassed with the CPU's device name and registered
through ``verl.plugin.platform.platform_manager.set_platform`` (verl ships CUDA, NPU and ROCm platforms),
``VERL_ENGINE_DEVICE=cuda`` so ``EngineRegistry`` picks the FSDP engine registered for CUDA, and the
TrainingWorker's methods on an instance built without Ray; the reference log-probs are set on the batch
where ``_compute_ref_log_prob`` (a second engine's forward) would put them. None changes the loss.
"""

from __future__ import annotations

# ---- harness: verl's own trainer code on the CPU (inlined: nothing of this repository is imported) ----
import importlib
import os
import socket
import sys
import tempfile
from functools import partial
from types import SimpleNamespace

import numpy as np
import torch

PAD, EOS, VOCAB = 0, 1, 16


def cpu_platform():
    """verl ships CUDA, NPU and ROCm platforms only: this stand-in is verl's CUDA platform with the
    CPU's device name and module, registered through verl's own ``set_platform`` extension point. It
    changes where tensors live, not what verl computes."""
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
    """A gloo process group of world size 1; ``VERL_ENGINE_DEVICE=cuda`` makes
    ``EngineRegistry`` pick the FSDP engine it registers for CUDA."""
    import torch.distributed as dist
    from verl.plugin.platform import platform_manager

    os.environ["VERL_ENGINE_DEVICE"] = "cuda"
    if platform_manager.get_platform().device_name != "cpu":
        platform_manager.set_platform(cpu_platform())
    if not dist.is_initialized():
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        env = {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
        }
        for key, value in env.items():
            os.environ.setdefault(key, value)
        dist.init_process_group("gloo", rank=0, world_size=1)


def save_tiny_qwen2(directory, seed=0):
    """A tiny Qwen2 (2 layers, width 32) with random weights and a word-level tokenizer, saved to
    ``directory`` (built from a config in-process: nothing is downloaded)."""
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


def make_worker(path, rows, group, micro, actor_settings, param_dtype="fp32"):
    """verl's TrainingWorker (its methods on an instance built without Ray) around an initialised
    FSDPEngineWithLMHead (FSDP2, gloo group of 1, no padding removal: the path without flash-attn)
    and verl.workers.utils.losses.ppo_loss with an ActorConfig built from ``actor_settings``."""
    from verl.trainer.config import CheckpointConfig
    from verl.utils.flops_counter import FlopsCounter
    from verl.workers.config import ActorConfig, FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
    from verl.workers.engine import EngineRegistry
    from verl.workers.engine_workers import TrainingWorker
    from verl.workers.utils.losses import ppo_loss

    setup_process()
    model_config = HFModelConfig(
        path=path,
        use_remove_padding=False,
        enable_gradient_checkpointing=False,
        override_config={"attn_implementation": "eager"},
    )
    precision = {"param_dtype": param_dtype, "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    engine_config = FSDPEngineConfig(
        strategy="fsdp2",
        use_dynamic_bsz=False,
        micro_batch_size_per_gpu=micro,
        infer_micro_batch_size_per_gpu=rows,
        mixed_precision=precision,
        use_torch_compile=False,
        use_remove_padding=False,
        seed=0,
    )
    optimizer_config = FSDPOptimizerConfig(
        lr=1e-2, optimizer="SGD", weight_decay=0.0, clip_grad=1e30, total_training_steps=1
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
        **{
            "strategy": "fsdp",
            "rollout_n": group,
            "ppo_mini_batch_size": rows // group,
            "ppo_micro_batch_size_per_gpu": micro,
            "use_torch_compile": False,
            **actor_settings,
        }
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


def rollout_batch(prompts, responses, group, response_length):
    """The batch as verl's agent loop hands it to the trainer: left-padded prompts, responses
    right-padded to ``rollout.response_length``, attention mask, position ids, uid per group."""
    from verl import DataProto
    from verl.utils.model import compute_position_id_with_mask

    rows, width_p = len(responses), max(len(p) for p in prompts)
    prompt_ids = torch.full((rows, width_p), PAD)
    prompt_mask = torch.zeros((rows, width_p), dtype=torch.long)
    response_ids = torch.full((rows, response_length), PAD)
    response_mask = torch.zeros((rows, response_length), dtype=torch.long)
    for i, response in enumerate(responses):
        prompt = prompts[i // group]
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
        non_tensors={"uid": np.array([f"g{i // group}" for i in range(rows)], dtype=object)},
    )


def trainer(worker, group, mini_batch, epochs=1, entropy_coeff=0.0):
    """The parts of RayPPOTrainer that _compute_old_log_prob and _update_actor read, with this
    process's TrainingWorker as the actor worker group."""
    from omegaconf import OmegaConf

    class Group:
        def compute_log_prob(self, td):
            return worker.infer_batch(td)

        def update_actor(self, td):
            return worker.train_mini_batch(td)

    config = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {"n": group, "temperature": 1.0, "multi_turn": {"enable": False}},
                "actor": {
                    "calculate_entropy": False,
                    "entropy_coeff": entropy_coeff,
                    "calculate_sum_pi_squared": False,
                    "ppo_mini_batch_size": mini_batch,
                    "ppo_epochs": epochs,
                    "data_loader_seed": 0,
                    "shuffle": False,
                },
            }
        }
    )
    return SimpleNamespace(config=config, actor_rollout_wg=Group(), distillation_config=None)


# ---- end of harness ----


PROMPTS = [[2, 3, 4], [2, 5]]
RESPONSES = [[6, 7, 8, 1], [9, 10, 1], [11, 12, 13, 14, 1], [3, 1]]
COEF = 1.0  # actor.kl_loss_coef (default 0.001; 1.0 so the KL term is the whole gradient, see advantages)


def actor_update(path, actor_settings, ref_shift):
    """One RayPPOTrainer._update_actor on the batch (scores all equal, so GRPO's advantages are 0 and
    the policy-gradient term contributes nothing): old log-probs from _compute_old_log_prob, the
    reference log-probs = old log-probs + ``ref_shift`` (the reference policy's log-probs, which the
    trainer's _compute_ref_log_prob would supply). Returns verl's gradient (read at optimizer_step),
    its logged metrics and the batch."""
    from verl.trainer.ppo.core_algos import AdvantageEstimator
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer, compute_advantage, compute_response_mask

    worker = make_worker(path, rows=4, group=2, micro=4, actor_settings=actor_settings)
    data = rollout_batch(PROMPTS, RESPONSES, group=2, response_length=6)
    data.batch["response_mask"] = compute_response_mask(data)
    data.meta_info["temperature"] = 1.0
    data.meta_info["global_token_num"] = data.batch["attention_mask"].sum(-1).tolist()
    tr = trainer(worker, group=2, mini_batch=2)
    old, _ = RayPPOTrainer._compute_old_log_prob(tr, data)
    old.batch.pop("entropys")
    data = data.union(old)
    data.batch["ref_log_prob"] = data.batch["old_log_probs"] + ref_shift * data.batch["response_mask"]
    data.batch["token_level_scores"] = torch.zeros_like(data.batch["old_log_probs"])
    data.batch["token_level_rewards"] = data.batch["token_level_scores"]
    data = compute_advantage(data, adv_estimator=AdvantageEstimator.GRPO, num_repeat=2)
    engine, step, grads = worker.engine, worker.engine.optimizer_step, {}

    def optimizer_step():  # reads the accumulated gradient, then lets verl step
        for name, p in engine.module.named_parameters():
            g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            grads[name] = g.detach().double().clone()
        return step()

    engine.optimizer_step = optimizer_step
    metrics = RayPPOTrainer._update_actor(tr, data).meta_info["metrics"]
    return grads, metrics, data


def expected_gradient(path, data, k2_backward=False):
    """The gradient of kl_loss_coef * token-mean_t k3_t, k3_t = exp(ref_t - logp_t) - (ref_t - logp_t) - 1
    (Schulman's k3, unclamped; spec KLL-1), on a plain transformers copy of the same weights, each row
    run unpadded (positions 0..L-1)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    mask = data.batch["response_mask"].bool()
    total, k3_sum, d_logp = 0.0, 0.0, []
    n_tokens = int(mask.sum())
    for i, response in enumerate(RESPONSES):
        ids = torch.tensor([PROMPTS[i // 2] + response])
        logits = model(input_ids=ids).logits[0, len(PROMPTS[i // 2]) - 1 : -1]
        logp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(response).unsqueeze(-1)).squeeze(-1)
        ref = data.batch["ref_log_prob"][i, : len(response)].double()
        diff = ref - logp.double()
        k3 = torch.exp(diff) - diff - 1
        if k2_backward:  # low_var_kl+: k3's value, k2's gradient 0.5 * (logp - ref)^2
            k3 = 0.5 * diff.square() + (k3 - 0.5 * diff.square()).detach()
        total = total + COEF * k3.sum() / n_tokens
        k3_sum += float(k3.sum())
        d_logp.append((1 - torch.exp(diff.detach())) / n_tokens)
    total.backward()
    return {n: p.grad.double() for n, p in model.named_parameters()}, k3_sum / n_tokens, d_logp


def compare(label, path, settings, shift, k2_backward=False):
    grads, metrics, data = actor_update(path, settings, shift)
    want, k3_mean, _ = expected_gradient(path, data, k2_backward)
    num = sum(float((grads[n] - want[n]).square().sum()) for n in want) ** 0.5
    den = sum(float(want[n].square().sum()) for n in want) ** 0.5
    logged = metrics.get("actor/kl_loss")
    logged = float(logged[0] if isinstance(logged, list) else logged) if logged is not None else None
    print(
        f"{label}: kl_loss expected {k3_mean:.4f} got {logged if logged is None else round(logged, 4)}; "
        f"gradient: expected |g| {den:.4g}, got relative error |g_verl - g| / |g| = {num / den:.4g}"
    )
    return num / den


def main():
    print(f"verl {importlib.import_module('verl').__version__}, torch {torch.__version__}")
    shift = torch.full((4, 6), 0.3)
    shift[0, 1] = shift[2, 0] = 3.0  # two tokens 3 nats below the reference: k3 = e^3 - 4 = 16.09 > 10
    settings = {"use_kl_loss": True, "kl_loss_coef": COEF, "kl_loss_type": "low_var_kl"}
    with tempfile.TemporaryDirectory() as tmp:
        path = save_tiny_qwen2(tmp)
        err = compare(
            "trigger: use_kl_loss true, kl_loss_type low_var_kl (its default), two tokens 3 nats "
            "below the reference",
            path,
            settings,
            shift,
        )
        compare(
            "same settings, every token 0.3 nats below the reference (k3 < 10)",
            path,
            settings,
            torch.full((4, 6), 0.3),
        )
        compare(
            "workaround kl_loss_type low_var_kl+ (its backward is k2's: "
            "expected gradient of 0.5 (logp - ref)^2)",
            path,
            {**settings, "kl_loss_type": "low_var_kl+"},
            shift,
            k2_backward=True,
        )
        _, metrics, _ = actor_update(path, {}, shift)
        print(
            f"defaults (use_kl_loss false): KL loss computed: {'actor/kl_loss' in metrics} (nothing clamped)"
        )
    return 1 if err > 1e-3 else 0


if __name__ == "__main__":
    sys.exit(main())
