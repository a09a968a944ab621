# Shared by bench/run_observability_cost.sh and bench/run_observability_ab.sh: the two workloads
# both measure, as gz-train arguments. Needs root (the repository), work (bert_small's text lines
# there, from text_lines), CNN_STEPS and BERT_STEPS.

args_of() {  # MODEL -> gz-train arguments
  case $1 in
    cnn) echo "--config $root/configs/fashion_mnist.yaml --max_steps $CNN_STEPS --test_limit 500" ;;
    bert_small) echo "--dataset text_lines --train_data $work/text --test_data $work/text --net_type bert_small \
      --input_size 64 --num_classes 4 --batch_size 8 --max_steps $BERT_STEPS --eval_batch_size 64 --test_limit 64 \
      --mode ddp --num_workers 1 --num_threads 1" ;;
    *) echo "unknown model $1" >&2; exit 2 ;;
  esac
}
