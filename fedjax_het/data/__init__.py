"""Data: raw sources (npz / TFDS), client partitions, and the padded device-side view."""
from fedjax_het.data.federated import ClientIndex
from fedjax_het.data.federated import FederatedData
from fedjax_het.data.federated import Layout
from fedjax_het.data.federated import build_federated_data
from fedjax_het.data.federated import group_clients
from fedjax_het.data.federated import pad_examples
from fedjax_het.data.federated import stack_replicas
from fedjax_het.data.federated import unpad_clients
from fedjax_het.data.partition import PARTITIONS
from fedjax_het.data.partition import class_counts
from fedjax_het.data.partition import partition
from fedjax_het.data.partition import train_test_split
from fedjax_het.data.partition_file import ClientTables
from fedjax_het.data.pool import Pool
from fedjax_het.data.pool import load_clients
from fedjax_het.data.pool import load_pool
from fedjax_het.data.sources import DATASETS
from fedjax_het.data.sources import DataFormatError
from fedjax_het.data.sources import DataNotFoundError
from fedjax_het.data.sources import RawData
from fedjax_het.data.sources import channel_stats
from fedjax_het.data.sources import load_dataset
from fedjax_het.data.sources import load_npz
from fedjax_het.data.sources import load_tfds
from fedjax_het.data.sources import make_synthetic
from fedjax_het.data.sources import resolve_source

__all__ = [
    "DATASETS", "PARTITIONS", "ClientIndex", "ClientTables", "DataFormatError",
    "DataNotFoundError", "FederatedData", "Layout", "Pool", "RawData",
    "build_federated_data", "channel_stats", "class_counts", "group_clients",
    "load_clients", "load_dataset", "load_npz", "load_pool", "load_tfds", "make_synthetic",
    "pad_examples", "partition", "resolve_source", "stack_replicas", "train_test_split",
    "unpad_clients",
]
