"""bench/gpu_pack.py (issue 46's GPU measurements in one command) in its quick CPU form, end to end: the closed
form's product against the floor and float64, the packing sweep's worker processes, eager against captured
steps; the JSON's structure and every ratio finite. Its numbers say nothing about a GPU."""


def test_peak_table_and_step_flops():
    from bench.gpu_pack import SHAPES, peak_tflops, step_flops

    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.4 and peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert peak_tflops("NVIDIA H200") == 989.4 and peak_tflops("NVIDIA A100-SXM4-80GB") is None
    # BERT-base at 32 × 128: 6 × 85M matrix parameters × 4,096 tokens ≈ 2.1 TFLOP, plus the attention's
    flops = step_flops(SHAPES["BERT-base shape"], 32, 128)
    assert 6 * 84.9e6 * 4096 < flops < 1.1 * 6 * 84.9e6 * 4096
