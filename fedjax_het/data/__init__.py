"""Data: raw sources (npz / TFDS), client partitions, and the padded device-side view."""
from fedjax_het.data.federated import (ClientIndex, FederatedData, Layout,
                                       build_federated_data, group_clients, pad_examples,
                                       stack_replicas, unpad_clients)
from fedjax_het.data.partition import (PARTITIONS, class_counts, partition,
                                       train_test_split)
from fedjax_het.data.partition_file import ClientTables
from fedjax_het.data.pool import Pool, load_clients, load_pool
from fedjax_het.data.sources import (DATASETS, DataFormatError, DataNotFoundError, RawData,
                                     channel_stats, load_dataset, load_npz, load_tfds,
                                     make_synthetic, resolve_source)

__all__ = [
    "DATASETS", "PARTITIONS", "ClientIndex", "ClientTables", "DataFormatError",
    "DataNotFoundError", "FederatedData", "Layout", "Pool", "RawData",
    "build_federated_data", "channel_stats", "class_counts", "group_clients",
    "load_clients", "load_dataset", "load_npz", "load_pool", "load_tfds", "make_synthetic",
    "pad_examples", "partition", "resolve_source", "stack_replicas", "train_test_split",
    "unpad_clients",
]
