"""Clusters: this process's role in a TensorFlow cluster (TF_CONFIG, SLURM, local), the launcher that
starts a whole local cluster, and preemption (SIGTERM at a step boundary)."""
