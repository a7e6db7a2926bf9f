"""Execution-provider options: what a GPU machine would be given (the options are plain data, checked here)."""

from edgekit.runtime.providers import provider_options


def shapes(spec: str) -> dict[str, str]:
    return dict(part.split(":") for part in spec.split(","))


def test_tensorrt_profiles_cover_the_batch_axis_and_a_dynamic_sequence_axis():
    serve = {"max_batch": 64, "num_gpus": 0.25, "gpu_memory_gb": 24.0}
    fixed = provider_options("tensorrt", serve, max_len=24, n_intents=7)
    assert shapes(fixed["trt_profile_min_shapes"])["input_ids"] == "1x24"
    assert shapes(fixed["trt_profile_max_shapes"])["input_ids"] == "64x24"
    dyn = provider_options("tensorrt", serve, max_len=24, n_intents=7, dynamic_seq=True)
    lo, opt, hi = (shapes(dyn[f"trt_profile_{k}_shapes"]) for k in ("min", "opt", "max"))
    assert (lo["input_ids"], opt["input_ids"], hi["input_ids"]) == ("1x3", "32x12", "64x24")
    assert lo["attention_mask"] == lo["input_ids"]
    # the word axis stays the package's: the in-graph Viterbi is unrolled over it
    assert lo["word_pos"] == "1x22" and hi["word_pos"] == "64x22" and hi["intent_mask"] == "64x7"
    assert dyn["trt_fp16_enable"] and dyn["trt_max_workspace_size"] == 4 << 30


def test_cuda_memory_limit_is_the_replica_share_of_the_card():
    opts = provider_options("cuda", {"num_gpus": 0.25, "gpu_memory_gb": 24.0})
    assert opts["gpu_mem_limit"] == 6 << 30
