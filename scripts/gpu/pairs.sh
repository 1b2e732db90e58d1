# The GPU evaluation's workload pairs, for scripts/gpu-matrix.sh, scripts/gpu-phases.sh and
# scripts/gpu-matrix2.sh (sourced): sets on, rate, off and noff (the number of offline processes,
# each running `off`; 1 unless said) for pair $1 (models of scripts/gpu/online.py, offline.py).
#   A  resnet18 b1 @20 req/s   vs resnet50 inference b1024 (the seeds' pair)
#   B  encoder (BERT-base-sized, seq 128, b1) @50 req/s vs resnet50 training b128
#   C  encoder @50 req/s       vs GPT decoder training (6 x d1024, seq 512, b8)
#   D  resnet18 b1 @20 req/s   vs resnet50 training b128
#   E  eager LLM decode (GPT-2-small-sized, KV cache, b1, 32 tokens, a host sync per token)
#      @4 req/s                vs fp16 GEMM loop (8192^3 matmuls back to back)
#   F  resnet50 b8 fp16 @50 req/s vs TWO resnet50 training b128 processes
#   G  resnet50 b8 fp16 @50 req/s vs ONE resnet50 training b128 ("nothing to remove")
#   H  encoder @50 req/s       vs encoder inference b8 (offline of many short kernels, launch-bound)
# gpu-matrix.sh and gpu-phases.sh run one offline process: there F is the same as G.
# gpu-matrix2.sh runs several pairs at once (one per GPU, one controller) where the host has the
# GPUs: a pair here must not assume it is alone on the host (nothing host-wide per pair).
noff=1
case "$1" in
  A) on=resnet18 rate=20 off=resnet50 ;;
  B) on=encoder  rate=50 off=resnet50_train ;;
  C) on=encoder  rate=50 off=gpt_train ;;
  D) on=resnet18 rate=20 off=resnet50_train ;;
  E) on=decode   rate=4  off=gemm ;;
  F) on=resnet50_b8 rate=50 off=resnet50_train noff=2 ;;
  G) on=resnet50_b8 rate=50 off=resnet50_train ;;
  H) on=encoder  rate=50 off=encoder ;;
  *) echo "unknown pair $1 (A|B|C|D|E|F|G|H)" >&2; exit 2 ;;
esac
