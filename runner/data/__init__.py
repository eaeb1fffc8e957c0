"""What a run trains and evaluates on.

A dataset option is a `_target_` callable (runner.data.builtin's fashion_mnist and synthetic, the file
formats of runner.data.files, or the user's own) that returns the training and test data and what they are
(runner.data.source.DataSplits). runner.data.loading turns that into the TrainingData the training loop
distributes: in memory (runner.data.in_memory) or streamed from disk (runner.data.streaming).
"""
