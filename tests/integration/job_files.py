"""Job files the multi-process tests submit (slurm_test.py, the HA tests)."""


def mlp_job_toml(name, data_dir, epochs, train_samples, workers=2):
    """A Fashion-MNIST MLP job: `workers` workers and one PS shard, batch 32, 2,000 test
    images, seed 7, SGD with momentum and a cosine schedule (lr 0.03, 0.2 warm-up epochs:
    at 0.05 one asynchronous run in many diverged, its accuracy 0.10)."""
    return """name = "%s"
model = "mlp"
dataset = "fashion-mnist"
data_dir = "%s"
epochs = %d
workers = %d
ps_shards = 1
batch_size = 32
train_samples = %d
test_samples = 2000
seed = 7

[optimizer]
lr = 0.03
momentum = 0.9
lr_schedule = "cosine"
warmup_epochs = 0.2
""" % (name, data_dir, epochs, workers, train_samples)
