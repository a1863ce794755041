"""Why megatron-core 0.19.2's defects happen and how to fix them (``Binding.remedies``,
:mod:`rlconform.harness.report.remedies`): engine function -> {kinds of failure: (cause, fix[, impact])}."""

CE = "megatron.core.tensor_parallel.cross_entropy"

REMEDIES = {
    f"{CE}.vocab_parallel_cross_entropy": {
        "partition dependence": (
            "with label smoothing, `vocab_size = exp_logits.size(-1)` and `log_probs.mean(dim=-1)` use the rank's "
            "own vocab shard: under TP > 1 the smoothing term averages one shard's log-probs, with the shard's "
            "size as K",
            "all-reduce the sum of the log-probs over the TP group and use the global vocab size (partition size × "
            "TP size)",
            "with label_smoothing > 0 the loss and its gradient depend on the TP size"),
        "NaN|inf": (
            "with label smoothing, `log_probs = torch.log(exp_logits)` takes the log of the softmax: a probability "
            "that underflows to 0 gives −inf, and the smoothing term's mean turns the loss to −inf",
            "compute the log-probs from the max-shifted logits (logits − max − log Σ exp), never as the log of the "
            "softmax"),
        "rounding": (
            "_VocabParallelCrossEntropy.forward calls `.float()` on the logits, which downcasts float64 ones: the "
            "loss and its gradient carry float32 rounding",
            "upcast half-precision logits only, and keep float64 as it is")},
    "megatron.core.fusions.fused_cross_entropy.fused_vocab_parallel_cross_entropy": {
        "rounding": (
            "the fused backward's calculate_gradients ends with `grad_input = grad_input.to(torch.bfloat16)`: the "
            "logits' gradient is bf16 whatever the logits' dtype",
            "cast the gradient to the logits' dtype (softmax.dtype) instead of bfloat16")},
}
