"""Models: CNN-1..5 of the pFedMoE/FedMRL papers and pFedMoE's gating network."""
from fedjax_het.models.cnn import CNN
from fedjax_het.models.cnn import CNNExtractor
from fedjax_het.models.cnn import Header
from fedjax_het.models.cnn import classify
from fedjax_het.models.cnn import extract
from fedjax_het.models.custom import Classifier
from fedjax_het.models.gating import SN_STATISTICS
from fedjax_het.models.gating import GatingNetwork
from fedjax_het.models.gating import SwitchableNorm
from fedjax_het.models.preprocess import CIFAR_MEAN
from fedjax_het.models.preprocess import CIFAR_STD
from fedjax_het.models.preprocess import normalize
from fedjax_het.models.registry import ARCHITECTURES
from fedjax_het.models.registry import HETEROGENEOUS
from fedjax_het.models.registry import MODEL_CHOICES
from fedjax_het.models.registry import ArchitectureChoices
from fedjax_het.models.registry import ArchSpec
from fedjax_het.models.registry import arch_spec
from fedjax_het.models.registry import check_architectures
from fedjax_het.models.registry import client_archs
from fedjax_het.models.registry import count_params
from fedjax_het.models.registry import get_extractor
from fedjax_het.models.registry import get_model
from fedjax_het.models.registry import is_architecture
from fedjax_het.models.registry import register_architecture

__all__ = ["ARCHITECTURES", "ArchSpec", "ArchitectureChoices", "CIFAR_MEAN", "CIFAR_STD",
           "CNN", "CNNExtractor", "Classifier", "GatingNetwork", "HETEROGENEOUS", "Header",
           "MODEL_CHOICES", "SN_STATISTICS", "SwitchableNorm", "arch_spec",
           "check_architectures", "classify", "client_archs", "count_params", "extract",
           "get_extractor", "get_model", "is_architecture", "normalize",
           "register_architecture"]
