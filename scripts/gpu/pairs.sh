# The GPU evaluation's workload pairs, for scripts/gpu-matrix.sh, scripts/gpu-phases.sh and
# scripts/gpu-matrix2.sh (sourced): sets on, rate, off and noff (the number of offline processes,
# each running `off`; 1 unless said) for pair $1 (models of scripts/gpu/online.py, offline.py),
# and the general form of every pair: ons (space-separated model@rate, one per online service)
# and offs (space-separated offline models, one process each).
#   A  resnet18 b1 @20 req/s   vs resnet50 inference b1024 (the seeds' pair)
#   B  encoder (BERT-base-sized, seq 128, b1) @50 req/s vs resnet50 training b128
#   C  encoder @50 req/s       vs GPT decoder training (6 x d1024, seq 512, b8)
#   D  resnet18 b1 @20 req/s   vs resnet50 training b128
#   E  eager LLM decode (GPT-2-small-sized, KV cache, b1, 32 tokens, a host sync per token)
#      @4 req/s                vs fp16 GEMM loop (8192^3 matmuls back to back)
#   F  resnet50 b8 fp16 @50 req/s vs TWO resnet50 training b128 processes
#   G  resnet50 b8 fp16 @50 req/s vs ONE resnet50 training b128 ("nothing to remove")
#   H  encoder @50 req/s       vs encoder inference b8 (offline of many short kernels, launch-bound)
#   I  diffusion denoiser (conv UNet, 20 steps, one sync per request) @2 req/s vs THREE different
#      offline jobs: fp16 GEMM loop, resnet50 training b128, GPT decoder training
#   J  TWO online services on one GPU: speech encoder-decoder (Whisper-like, 24 tokens, a host
#      sync per token) @3 req/s and resnet18 b1 @30 req/s, vs GPT decoder training
# A-H are given as on/rate/off/noff (ons and offs derived); I-J as ons/offs, with on/rate/off set
# from their first entries and noff the number of offline processes. gpu-matrix.sh and
# gpu-phases.sh run one online service (on) and one offline process (off): there F is the same
# as G, and I and J are only their first service against their first offline model.
# gpu-matrix2.sh runs every entry of ons and offs, and several pairs at once (one per GPU, one
# controller) where the host has the GPUs: a pair here must not assume it is alone on the host
# (nothing host-wide per pair).
noff=1 ons= offs=  # reset: this file is sourced once per pair in one shell
case "$1" in
  A) on=resnet18 rate=20 off=resnet50 ;;
  B) on=encoder  rate=50 off=resnet50_train ;;
  C) on=encoder  rate=50 off=gpt_train ;;
  D) on=resnet18 rate=20 off=resnet50_train ;;
  E) on=decode   rate=4  off=gemm ;;
  F) on=resnet50_b8 rate=50 off=resnet50_train noff=2 ;;
  G) on=resnet50_b8 rate=50 off=resnet50_train ;;
  H) on=encoder  rate=50 off=encoder ;;
  I) ons="denoise@2" offs="gemm resnet50_train gpt_train" ;;
  J) ons="speech@3 resnet18@30" offs="gpt_train" ;;
  *) echo "unknown pair $1 (A|B|C|D|E|F|G|H|I|J)" >&2; exit 2 ;;
esac
if [ -n "$ons" ]; then
  on=${ons%% *} off=${offs%% *}
  rate=${on#*@} on=${on%%@*}
  noff=$(wc -w <<<"$offs")  # (not `set --`: that would replace the sourcing script's arguments)
else
  ons="$on@$rate" offs=$(for _ in $(seq "$noff"); do printf '%s ' "$off"; done)
  offs=${offs% }
fi
