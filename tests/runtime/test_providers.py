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


def test_cuda_preload_keeps_stdout_clean_and_warns_once(monkeypatch, capsys, caplog):
    """onnxruntime-gpu's preload_dlls prints every CUDA library it misses on stdout, where `edgekit predict` and
    `bench` write their JSON (seen with onnxruntime-gpu 1.31.1 on a machine without CUDA 13)."""
    import onnxruntime as ort

    from edgekit.runtime import providers

    calls = []

    def preload_dlls():
        calls.append(1)
        print("Failed to load libcublasLt.so.13: libcublasLt.so.13: cannot open shared object file")
        print("Failed to load libcurand.so.10: libcurand.so.10: cannot open shared object file")
        print("Please follow https://onnxruntime.ai/docs/install/#cuda-and-cudnn to install CUDA.")

    monkeypatch.setattr(ort, "preload_dlls", preload_dlls, raising=False)
    monkeypatch.setattr(ort, "get_available_providers",
                        lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    providers._preload_cuda.cache_clear()
    try:
        with caplog.at_level("WARNING", logger="edgekit.runtime"):
            assert providers.choose(["cpu"])[0][0] == "CPUExecutionProvider" and not calls  # no GPU asked: no load
            for _ in range(3):
                assert providers.choose(["cuda", "cpu"])[0][0] == "CUDAExecutionProvider"
    finally:
        providers._preload_cuda.cache_clear()
    assert calls == [1] and capsys.readouterr().out == ""
    warned = [r.getMessage() for r in caplog.records if "CUDA libraries are missing" in r.getMessage()]
    assert len(warned) == 1 and "libcublasLt.so.13, libcurand.so.10" in warned[0]
