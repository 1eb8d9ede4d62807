"""Data: raw sources (npz / TFDS), client partitions, and the padded device-side view."""
from fedjax_het.data.federated import (ClientIndex, FederatedData, Layout,
                                       build_federated_data, group_clients, pad_examples,
                                       stack_replicas, unpad_clients)
from fedjax_het.data.partition import (PARTITIONS, class_counts, partition,
                                       train_test_split)
from fedjax_het.data.sources import (DATASETS, DataFormatError, DataNotFoundError, RawData,
                                     load_dataset, load_npz, load_tfds, make_synthetic,
                                     resolve_source)

__all__ = [
    "DATASETS", "PARTITIONS", "ClientIndex", "DataFormatError", "DataNotFoundError",
    "FederatedData", "Layout", "RawData", "build_federated_data", "class_counts",
    "group_clients", "load_dataset", "load_npz", "load_tfds", "make_synthetic",
    "pad_examples", "partition", "resolve_source", "stack_replicas", "train_test_split",
    "unpad_clients",
]
