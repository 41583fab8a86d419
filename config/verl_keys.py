"""verl's config keys, as asyncrl reads them: what a verl launch script or YAML file means here.

A key of asyncrl's own config (docs/configuration.md) is simply accepted. For every other key
verl has, this module says one of:

* alias: verl's name (or place) of a setting asyncrl has; the value goes to asyncrl's key, in
  asyncrl's units where verl counts differently (``rollout.test_freq`` counts weight versions,
  ``trainer.test_freq`` steps).
* ignored: no effect on what asyncrl computes (experiment names, GPU counts, micro-batching,
  the critic GRPO does not have); a warning names each at start-up.
* fixed: asyncrl always behaves one way (no KL loss, no top-p, ...): the value that says so is
  ignored, any other is refused.
* refused: "not supported by asyncrl", with the reason (FSDP internals, vLLM memory settings,
  dataset files, ...). A run never starts with a setting it would not honour.

Read from verl's ``verl/trainer/config/_generated_ppo_trainer.yaml``, its fully async recipe
(``verl/experimental/fully_async_policy``) and that recipe's README, at volcengine/verl
b178a3cd56f58b2d502255daba591e92833930a7. No verl code is used; only its key names.
"""

from __future__ import annotations

from asyncrl.config.sections import RESUME_WHY
from asyncrl.config.verl_rules import (
    VerlKey,
    _local_dir,
    _total_steps,
    _versions_to_steps,
    alias,
    fixed,
    ignored,
    refused,
)

TOTAL = "trainer.total_training_steps"
TOTAL_WHY = (
    "verl counts samples (prompts) or epochs; asyncrl steps: min(total_rollout_steps, "
    "total_epochs x data.train_size, or the rows of data.train_files) // "
    "(ppo_mini_batch_size x require_batches)"
)
FSDP = (
    "FSDP/Megatron sharding, offload and sequence-parallel internals: asyncrl's trainer shards "
    "with FSDP2 over trainer.nnodes x trainer.n_gpus_per_node ranks, with no such knob"
)
FSDP_SAME = (
    "how verl's FSDP data parallelism shards and schedules the model over its GPUs: the same "
    "updates as asyncrl's trainer (FSDP2 over trainer.nnodes x trainer.n_gpus_per_node ranks)"
)
ENGINE = (
    "vLLM/SGLang engine setting: asyncrl's rollout engine is its own (actor_rollout_ref.rollout."
    "name: vllm, hf, hf_cached, hf_static or sim), with no such knob"
)
BATCHING = (
    "how a pass is split for memory or speed, with no effect on the result: asyncrl evaluates "
    "and feeds data its own way"
)
LOG_PROB_MICRO = (
    "asyncrl's no-grad log-prob passes (old and proximal log-probs) use the actor's "
    "micro-batches: actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu or use_dynamic_bsz "
    "with ppo_max_token_len_per_gpu"
)
REF = (
    "the reference model is the policy the run started from, kept by the trainer for "
    "actor.use_kl_loss; it has no settings of its own"
)
ENGINE_SPEED = (
    "a vLLM/SGLang memory or scheduling knob: it changes how fast, not what is generated, and "
    "asyncrl's engines (actor_rollout_ref.rollout.name) have no such knob"
)
OVERLONG = "verl's dapo reward manager's setting: asyncrl applies it to every rollout's reward"
KL = "used only with a KL penalty in the reward, which asyncrl does not have (actor.use_kl_loss)"
CRITIC = (
    "GRPO has no critic (verl builds none with adv_estimator=grpo either); asyncrl's "
    "algorithm.adv_estimator is grpo, where verl's default is gae (PPO with this critic)"
)
LAYOUT = (
    "resource layout: asyncrl runs trainer.nnodes x trainer.n_gpus_per_node trainer ranks and "
    "actor_rollout_ref.rollout.num_workers rollout workers (placement: ray.* with launcher=ray)"
)
NAMES = "experiment naming for verl's trackers: asyncrl names a run by run_id"
PROFILE = "profiling: asyncrl traces with OpenTelemetry instead (tracing.*)"
DATA = (
    "a dataset option asyncrl's loader lacks: it reads verl-format parquet as it is "
    "(data.train_files/val_files, data.prompt_key; text chat messages)"
)
MODEL = (
    "model loading: asyncrl loads actor_rollout_ref.model.path as it is (AutoModelForCausalLM "
    "and its tokenizer, float32), with no such option"
)
REWARD = (
    "reward managers and reward models: asyncrl's reward is its task's rule or "
    "custom_reward_function, with no reward manager"
)
LR = (
    "asyncrl's AdamW takes actor_rollout_ref.actor.optim.lr with verl's warm-up and constant "
    "or cosine schedule (lr_warmup_steps, lr_warmup_steps_ratio, lr_scheduler_type, "
    "min_lr_ratio, num_cycles)"
)
CKPT = "asyncrl writes checkpoints to output_dir/run_id/checkpoints: set output_dir and run_id"
TARGET = "Hydra's instantiation target: asyncrl's config classes are its own"
VERL_KEYS: dict[str, VerlKey] = {
    # --- aliases ---------------------------------------------------------------------------
    "actor_rollout_ref.actor.grad_clip": alias("actor_rollout_ref.actor.optim.grad_clip"),
    "actor_rollout_ref.actor.optim.warmup_style": alias(
        "actor_rollout_ref.actor.optim.lr_scheduler_type",
        "verl's older name of lr_scheduler_type (null: constant)",
        lambda value, _get: "constant" if value is None else value,
    ),
    "actor_rollout_ref.actor.optim.clip_grad": alias("actor_rollout_ref.actor.optim.grad_clip"),
    "actor_rollout_ref.actor.use_rollout_log_probs": alias(
        "async_training.use_rollout_log_probs", "verl's copy for the actor"
    ),
    "actor_rollout_ref.rollout.prompt_length": alias("data.max_prompt_length"),
    "actor_rollout_ref.rollout.response_length": alias("data.max_response_length"),
    "async_training.checkpoint_engine.device_buffer_size_M": alias(
        "sync.bucket_size_mb", "the size of the buckets the weights are broadcast in"
    ),
    "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes": alias(
        "sync.bucket_size_mb", "the size of the buckets the weights are broadcast in"
    ),
    "rollout.total_rollout_steps": alias(TOTAL, TOTAL_WHY, _total_steps),
    "rollout.total_epochs": alias(TOTAL, TOTAL_WHY, _total_steps),
    "trainer.total_epochs": alias(TOTAL, TOTAL_WHY, _total_steps),
    "rollout.test_freq": alias(
        "trainer.test_freq",
        "verl counts weight versions, asyncrl steps: x async_training.trigger_parameter_sync_step",
        _versions_to_steps,
    ),
    "ray_kwargs.ray_init.num_cpus": alias("ray.num_cpus"),
    # --- verl's fully async recipe ---------------------------------------------------------
    "async_training.checkpoint_engine.enable": ignored(
        "asyncrl always syncs weights with its bucketed broadcast (sync.*)"
    ),
    "async_training.checkpoint_engine.overlap_broadcast_and_consume": ignored(
        "asyncrl always overlaps: a worker unpacks bucket i while bucket i+1 arrives"
    ),
    "actor_rollout_ref.checkpoint_engine.*": ignored(
        "verl's copy of async_training.checkpoint_engine for its workers"
    ),
    "rollout.n": ignored(
        "verl's fully async reads actor_rollout_ref.rollout.n (asyncrl too), not this copy"
    ),
    "rollout.nnodes": ignored(LAYOUT),
    "rollout.n_gpus_per_node": ignored(LAYOUT),
    "data.gen_batch_size": fixed("asyncrl's workers take prompts one at a time (as verl's)", 1),
    # --- data --------------------------------------------------------------------------------
    "data.*": refused(DATA),
    "data.truncation": VerlKey(
        "fixed",
        "asyncrl never cuts a prompt of data.train_files/val_files (one over "
        "data.max_prompt_length is left out and counted, as verl's filter_overlong_prompts), "
        "and keeps a built-in task's last tokens",
        # verl's example scripts set 'error' beside filter_overlong_prompts=True: no prompt cut
        ok=lambda v, get: v == "left" or (v == "error" and bool(get("data.train_files"))),
        ok_text="left, or error with data.train_files",
    ),
    "data.train_batch_size": ignored(
        "a step is actor.ppo_mini_batch_size x async_training.require_batches samples (verl's "
        "fully async ignores train_batch_size too)"
    ),
    "data.val_batch_size": ignored(BATCHING),
    "data.return_raw_chat": ignored(
        "asyncrl's prompt records carry the chat messages as they are; the rollout applies the "
        "chat template"
    ),
    "data.return_raw_input_ids": ignored("prompt format for a separate reward model's tokenizer"),
    "data.return_full_prompt": ignored("prompt format for logging"),
    "data.dataloader_num_workers": ignored("data loading threads: asyncrl's feed is a topic"),
    "data.validation_shuffle": ignored("the order of held-out prompts does not change accuracy"),
    "data.filter_overlong_prompts": ignored(
        "prompts of data.train_files/val_files longer than data.max_prompt_length after the "
        "chat template are always left out (and counted); a built-in task's keep their last tokens"
    ),
    "data.filter_overlong_prompts_workers": ignored(BATCHING),
    "data.tool_config_path": ignored(
        "verl's dataset copy of actor_rollout_ref.rollout.multi_turn.tool_config_path"
    ),
    "data.use_shm": ignored("shared-memory loading: asyncrl reads the parquet files directly"),
    # --- model -------------------------------------------------------------------------------
    "actor_rollout_ref.model.*": refused(MODEL),
    "actor_rollout_ref.model.use_remove_padding": ignored(
        "a kernel-level optimisation: the same logits with or without padding"
    ),
    "actor_rollout_ref.model.enable_gradient_checkpointing": ignored(
        "activation memory only: the same gradients"
    ),
    "actor_rollout_ref.model.enable_activation_offload": ignored("activation memory only"),
    "actor_rollout_ref.model.use_fused_kernels": ignored("a kernel choice: the same results"),
    "actor_rollout_ref.model.fused_kernel_options.*": ignored("a kernel choice: the same results"),
    "actor_rollout_ref.model.use_liger": ignored("a kernel choice: the same results"),
    "actor_rollout_ref.model.use_shm": ignored("shared-memory loading of a checkpoint"),
    "actor_rollout_ref.model.tiled_mlp.*": ignored("activation memory only"),
    "actor_rollout_ref.model.lora_rank": fixed("asyncrl trains every weight (no LoRA)", 0),
    "actor_rollout_ref.model.lora_alpha": ignored("used only with lora_rank > 0"),
    "actor_rollout_ref.model.target_modules": ignored("used only with lora_rank > 0"),
    "actor_rollout_ref.model.exclude_modules": ignored("used only with lora_rank > 0"),
    "actor_rollout_ref.model.lora_adapter_path": fixed("asyncrl loads no LoRA adapter", None),
    "actor_rollout_ref.model.mtp.*": ignored("used only with mtp.enable"),
    "actor_rollout_ref.model.mtp.enable": fixed("no multi-token prediction", False),
    "actor_rollout_ref.hybrid_engine": fixed(
        "asyncrl's rollout workers are processes apart from the trainer", False
    ),
    # --- actor -------------------------------------------------------------------------------
    "actor_rollout_ref.actor.strategy": fixed(FSDP_SAME, "fsdp", "fsdp2"),
    "actor_rollout_ref.actor.fsdp_config.*": refused(FSDP),
    "actor_rollout_ref.actor.fsdp_config.strategy": fixed(FSDP_SAME, "fsdp", "fsdp2"),
    "actor_rollout_ref.actor.fsdp_config.fsdp_size": ignored(FSDP_SAME),
    "actor_rollout_ref.actor.fsdp_config.wrap_policy.*": ignored(FSDP_SAME),
    "actor_rollout_ref.actor.fsdp_config.reshard_after_forward": ignored(FSDP_SAME),
    "actor_rollout_ref.actor.fsdp_config.forward_prefetch": ignored(FSDP_SAME),
    "actor_rollout_ref.actor.fsdp_config.use_orig_params": ignored(FSDP_SAME),
    "actor_rollout_ref.actor.fsdp_config.use_torch_compile": ignored(
        "a kernel choice: the same results"
    ),
    "actor_rollout_ref.actor.fsdp_config.entropy_from_logits_with_chunking": ignored("memory only"),
    "actor_rollout_ref.actor.fsdp_config.entropy_checkpointing": ignored("memory only"),
    "actor_rollout_ref.actor.fsdp_config.model_dtype": fixed(
        "the trainer keeps float32 weights, gradients and AdamW state (it computes in "
        "fsdp_config.dtype)",
        "fp32",
        "float32",
    ),
    "actor_rollout_ref.actor.fsdp_config.param_offload": fixed(FSDP, False),
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": fixed(FSDP, False),
    "actor_rollout_ref.actor.fsdp_config.offload_policy": fixed(FSDP, False),
    "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size": fixed(FSDP, 1),
    "actor_rollout_ref.actor.megatron.*": refused(FSDP),
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": fixed(FSDP, 1),
    "actor_rollout_ref.actor.calculate_entropy": ignored("a metric only"),
    "actor_rollout_ref.actor.shuffle": ignored("each mini-batch is one update: order is moot"),
    "actor_rollout_ref.actor.data_loader_seed": ignored("each mini-batch is one update"),
    "actor_rollout_ref.actor.ppo_micro_batch_size": alias(
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
        "verl's global micro-batch size; asyncrl's trainer is one GPU, so it is the per-GPU one",
    ),
    "actor_rollout_ref.actor.rollout_n": ignored("verl's copy of actor_rollout_ref.rollout.n"),
    "actor_rollout_ref.actor.use_remove_padding": ignored("a kernel-level optimisation"),
    "actor_rollout_ref.actor.use_torch_compile": ignored("a kernel choice: the same results"),
    "actor_rollout_ref.actor.use_fused_kernels": ignored("a kernel choice: the same results"),
    "actor_rollout_ref.actor.entropy_from_logits_with_chunking": ignored("memory only"),
    "actor_rollout_ref.actor.entropy_checkpointing": ignored("memory only"),
    "actor_rollout_ref.actor.freeze_vision_tower": ignored("asyncrl's policy has no vision tower"),
    "actor_rollout_ref.actor.tau_pos": ignored("used only with policy_loss.loss_mode=gpg"),
    "actor_rollout_ref.actor.tau_neg": ignored("used only with policy_loss.loss_mode=gpg"),
    "actor_rollout_ref.actor.use_prefix_grouper": fixed("no prefix grouping", False),
    "actor_rollout_ref.actor.calculate_sum_pi_squared": fixed("a metric asyncrl lacks", False),
    "actor_rollout_ref.actor.sum_pi_squared_checkpointing": ignored("memory only"),
    "actor_rollout_ref.actor.policy_loss.*": ignored(
        "used only with another policy_loss.loss_mode"
    ),
    "actor_rollout_ref.actor.policy_loss.loss_mode": fixed(
        "asyncrl's loss is PPO's clip", "vanilla"
    ),
    "actor_rollout_ref.actor.checkpoint.*": ignored(
        "asyncrl's checkpoint always holds the model, optimizer and run state"
    ),
    "actor_rollout_ref.actor.profiler.*": ignored(PROFILE),
    "actor_rollout_ref.actor.router_replay.*": fixed("no MoE router replay", "disabled", None),
    "actor_rollout_ref.actor.optim.*": refused(LR),
    "actor_rollout_ref.actor.optim.optimizer": fixed("asyncrl's optimizer is AdamW", "AdamW"),
    "actor_rollout_ref.actor.optim.optimizer_impl": fixed("torch's AdamW", "torch.optim"),
    "actor_rollout_ref.actor.optim.betas": fixed("torch's AdamW betas", [0.9, 0.999]),
    "actor_rollout_ref.actor.optim.total_training_steps": ignored(
        "verl fills it in for its LR schedule; asyncrl's is trainer.total_training_steps"
    ),
    "actor_rollout_ref.actor.optim.override_optimizer_config": fixed("torch's AdamW", None),
    # --- reference model, critic, reward -----------------------------------------------------
    "actor_rollout_ref.ref.*": ignored(REF),
    "critic.*": ignored(CRITIC),
    "reward_model.*": ignored(
        "the reward model's settings: used only with reward_model.enable=true (refused)"
    ),
    "reward_model.reward_kwargs.*": refused(REWARD),
    # DAPO's overlong reward shaping: verl's dapo reward manager's, asyncrl's algorithm key
    **{
        f"{prefix}.{leaf}": alias(f"algorithm.overlong_buffer.{leaf}", OVERLONG)
        for prefix in (
            "reward_model.reward_kwargs.overlong_buffer_cfg",
            "reward_model.overlong_buffer",
        )
        for leaf in ("enable", "len", "penalty_factor", "log")
    },
    "reward_model.reward_kwargs.max_resp_len": alias(
        "algorithm.overlong_buffer.max_resp_len", OVERLONG
    ),
    "reward_model.sandbox_fusion.*": ignored(
        "used by verl's code-execution rewards, for dataset files asyncrl does not load"
    ),
    "reward_model.enable": fixed(REWARD, False),
    "reward_model.reward_manager": fixed(
        "asyncrl's reward is its task's rule or custom_reward_function, called as verl's naive "
        "and dapo managers call compute_score; dapo's overlong penalty is "
        "algorithm.overlong_buffer",
        "naive",
        "dapo",
    ),
    "reward_model.enable_resource_pool": ignored(LAYOUT),
    "reward_model.n_gpus_per_node": ignored(LAYOUT),
    "reward_model.nnodes": ignored(LAYOUT),
    "reward_model.launch_reward_fn_async": ignored(
        "asyncrl's workers always score as trajectories finish, off their decoding loop "
        "(custom_reward_function.num_workers calls at once)"
    ),
    "reward_model.num_workers": alias(
        "custom_reward_function.num_workers",
        "verl's reward loop workers; asyncrl's are per rollout worker, one process each",
        lambda value, _: 4 if value is None else value,  # verl's null: its default
    ),
    "reward_manager.*": refused(REWARD),
    "reward_manager.name": fixed(
        "asyncrl's reward is called as verl's naive and dapo managers call compute_score; "
        "dapo's overlong penalty is algorithm.overlong_buffer",
        "naive",
        "dapo",
    ),
    "reward_manager.source": fixed(REWARD, "register"),
    "reward_manager.module.*": ignored("used only with reward_manager.source=importlib"),
    # --- rollout -----------------------------------------------------------------------------
    "actor_rollout_ref.rollout.*": refused(ENGINE),
    # vLLM/SGLang memory and scheduling knobs: how fast, never what is generated (the vllm
    # engine's own: config/rollout_vllm.py)
    **{
        f"actor_rollout_ref.rollout.{knob}": ignored(ENGINE_SPEED)
        for knob in (
            "cudagraph_capture_sizes",
            "free_cache_engine",
            "scheduling_policy",
            "load_format",
            "multi_stage_wake_up",
            "layered_summon",
            "skip_tokenizer_init",
        )
    },
    "actor_rollout_ref.rollout.mode": ignored(
        "asyncrl's workers always generate as servers of their own (verl's async mode)"
    ),
    "actor_rollout_ref.rollout.calculate_log_probs": ignored(
        "asyncrl's workers always record the rollout's log-probs"
    ),
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz": ignored(LOG_PROB_MICRO),
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": ignored(LOG_PROB_MICRO),
    "actor_rollout_ref.rollout.log_prob_micro_batch_size": ignored(LOG_PROB_MICRO),
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": ignored(LOG_PROB_MICRO),
    "actor_rollout_ref.rollout.tensor_model_parallel_size": fixed(
        "one asyncrl rollout worker holds the whole model", 1
    ),
    "actor_rollout_ref.rollout.data_parallel_size": fixed(
        "one model per worker: more workers are actor_rollout_ref.rollout.num_workers", 1
    ),
    "actor_rollout_ref.rollout.pipeline_model_parallel_size": fixed(
        "one asyncrl rollout worker holds the whole model", 1
    ),
    "actor_rollout_ref.rollout.expert_parallel_size": fixed(
        "one asyncrl rollout worker holds the whole model", 1
    ),
    "actor_rollout_ref.rollout.top_p": fixed(
        "asyncrl samples from the whole distribution at rollout.temperature (no top-p)", 1
    ),
    "actor_rollout_ref.rollout.top_k": fixed(
        "asyncrl samples from the whole distribution at rollout.temperature (no top-k)", -1, 0
    ),
    "actor_rollout_ref.rollout.do_sample": fixed("asyncrl's rollout samples", True),
    "actor_rollout_ref.rollout.ignore_eos": fixed("generation stops at EOS", False),
    "actor_rollout_ref.rollout.over_sample_rate": fixed("no over-sampling", 0),
    "actor_rollout_ref.rollout.skip_rollout": fixed("asyncrl always generates", False),
    "actor_rollout_ref.rollout.val_kwargs.n": fixed("one validation answer per prompt", 1),
    "actor_rollout_ref.rollout.multi_turn.max_parallel_calls": ignored(
        "asyncrl runs a turn's tool calls all at once"
    ),
    "actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side": fixed(
        "asyncrl keeps a long tool response's start (verl's left; its right keeps the end, "
        "middle both ends)",
        "left",
    ),
    "actor_rollout_ref.rollout.multi_turn.use_inference_chat_template": ignored(
        "asyncrl's tasks use no chat template"
    ),
    "actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode": ignored(
        "a debugging check of chat-template tokenisation"
    ),
    "actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts": ignored(
        "used by SFT data generation"
    ),
    "actor_rollout_ref.rollout.mtp.*": ignored("verl's copy of actor_rollout_ref.model.mtp"),
    "actor_rollout_ref.rollout.agent.agent_loop_config_path": fixed(
        "asyncrl's agent loop is its own (multi_turn.*)", None
    ),
    "actor_rollout_ref.rollout.agent.custom_async_server.*": fixed(
        "asyncrl's rollout engine is its own", None
    ),
    "actor_rollout_ref.rollout.agent.num_workers": ignored(
        "asyncrl's agent loops run inside each rollout worker"
    ),
    "actor_rollout_ref.rollout.agent.default_agent_loop": ignored(
        "asyncrl picks the loop by multi_turn.enable"
    ),
    "actor_rollout_ref.rollout.checkpoint_engine.backend": ignored(
        "asyncrl's weight sync backend is sync.backend"
    ),
    "actor_rollout_ref.rollout.trace.*": ignored(PROFILE),
    "actor_rollout_ref.rollout.profiler.*": ignored(PROFILE),
    "actor_rollout_ref.rollout.prometheus.*": ignored(
        "metrics export: asyncrl writes metrics.jsonl and the steps topic"
    ),
    "actor_rollout_ref.rollout.disable_log_stats": ignored("engine logging"),
    # --- trainer -----------------------------------------------------------------------------
    "trainer.project_name": ignored(NAMES),
    "trainer.experiment_name": ignored(NAMES),
    "trainer.balance_batch": ignored("balances sequence lengths across data-parallel ranks"),
    "trainer.log_val_generations": ignored("logging choice"),
    "trainer.rollout_data_dir": ignored("logging choice: asyncrl's samples are on the log"),
    "trainer.validation_data_dir": ignored("logging choice"),
    "trainer.val_before_train": ignored(
        "asyncrl evaluates before the first step whenever trainer.test_freq > 0"
    ),
    "trainer.val_only": fixed("asyncrl always trains", False),
    "trainer.critic_warmup": fixed(CRITIC, 0),
    "trainer.resume_from_path": fixed(RESUME_WHY, None),
    "trainer.default_local_dir": alias(
        "output_dir",
        "verl's run directory: asyncrl's run is output_dir/run_id, so this is output_dir, or "
        "its parent where its last part is the run_id",
        _local_dir,
    ),
    "trainer.default_hdfs_dir": fixed(CKPT, None),
    "trainer.del_local_ckpt_after_load": fixed(CKPT, False),
    "trainer.max_actor_ckpt_to_keep": ignored("asyncrl's is trainer.keep_checkpoints"),
    "trainer.max_critic_ckpt_to_keep": ignored(CRITIC),
    "trainer.esi_redundant_time": ignored("a cloud instance's expiry: asyncrl saves by save_freq"),
    "trainer.ray_wait_register_center_timeout": ignored(LAYOUT),
    "trainer.use_legacy_worker_impl": ignored("verl's worker implementation"),
    # --- the rest of verl's top level --------------------------------------------------------
    "algorithm.use_kl_in_reward": fixed("asyncrl has no KL penalty in the reward", False),
    "algorithm.kl_penalty": ignored(KL),
    "algorithm.kl_ctrl.*": ignored(KL),
    "algorithm.gamma": fixed("GRPO's outcome reward is not discounted", 1),
    "algorithm.lam": ignored("GAE only: asyncrl's estimator is GRPO"),
    "algorithm.use_pf_ppo": fixed("no preference-feedback PPO", False),
    "algorithm.pf_ppo.*": ignored("used only with algorithm.use_pf_ppo"),
    "algorithm.rollout_correction.bypass_mode": fixed(
        "asyncrl corrects in verl's decoupled mode only (async_training.compute_prox_log_prob); "
        "its bypass (the rollout's log-probs as old_log_prob) is async_training."
        "use_rollout_log_probs, without correction",
        False,
    ),
    "algorithm.rollout_correction.loss_type": ignored("used only with bypass_mode=true"),
    "global_profiler.*": ignored(PROFILE),
    "transfer_queue.enable": fixed("asyncrl's samples travel over Kafka", False),
    "ray_kwargs.*": ignored(LAYOUT),
}


def lookup(key: str) -> VerlKey | None:
    """The rule for a verl key that is not asyncrl's own: exact, else its longest section."""
    if key.rsplit(".", 1)[-1] == "_target_":
        return ignored(TARGET)
    if key in VERL_KEYS:
        return VERL_KEYS[key]
    parts = key.split(".")
    for i in range(len(parts), 0, -1):
        rule = VERL_KEYS.get(".".join(parts[:i]) + ".*")
        if rule is not None:
            return rule
    return None
