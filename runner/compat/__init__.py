"""Where the runner relies on a library's private names (MLflow's, tqdm's): one module per library, each tested."""
