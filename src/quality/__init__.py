"""Quality beside speed: how far a job's model departs from its reference, with the uncertainty of each figure.

- scoring: one model's logits for a window, reduced to what the comparisons need (the target's log-prob,
  the top token, the log-probs at the reference's top-k tokens);
- divergence: KL divergence and top-1 agreement against the reference, teacher-forced generation divergence;
- stats: standard errors, bootstrap intervals, Δ perplexity by the delta method;
- reference: the reference precision's scores, computed once and cached (safetensors + JSON);
- paired: two jobs' per-example scores compared paired (McNemar, a paired permutation test);
- front: the speed–quality Pareto front;
- harness: quantspec's model as lm-evaluation-harness's LM.

Nothing here knows of MLflow or Hydra; src/tasks/ runs it in jobs, src/tracking/readback/speed_quality.py reads it back.
"""
