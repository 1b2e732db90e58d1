# The GPU evaluation's workload pairs, for scripts/gpu-matrix.sh and scripts/gpu-phases.sh
# (sourced): sets on, rate and off for pair $1 (models of scripts/gpu/online.py, offline.py).
#   A  resnet18 b1 @20 req/s   vs resnet50 inference b1024 (the seeds' pair)
#   B  encoder (BERT-base-sized, seq 128, b1) @50 req/s vs resnet50 training b128
#   C  encoder @50 req/s       vs GPT decoder training (6 x d1024, seq 512, b8)
#   D  resnet18 b1 @20 req/s   vs resnet50 training b128
case "$1" in
  A) on=resnet18 rate=20 off=resnet50 ;;
  B) on=encoder  rate=50 off=resnet50_train ;;
  C) on=encoder  rate=50 off=gpt_train ;;
  D) on=resnet18 rate=20 off=resnet50_train ;;
  *) echo "unknown pair $1 (A|B|C|D)" >&2; exit 2 ;;
esac
