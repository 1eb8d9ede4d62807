"""Models: CNN-1..5 of the pFedMoE/FedMRL papers and pFedMoE's gating network."""
from fedjax_het.models.cnn import CNN, CNNExtractor, Header, classify, extract
from fedjax_het.models.custom import Classifier
from fedjax_het.models.gating import GatingNetwork, SN_STATISTICS, SwitchableNorm
from fedjax_het.models.preprocess import CIFAR_MEAN, CIFAR_STD, normalize
from fedjax_het.models.registry import (ARCHITECTURES, HETEROGENEOUS, MODEL_CHOICES,
                                        ArchitectureChoices, ArchSpec, arch_spec,
                                        check_architectures, client_archs, count_params,
                                        get_extractor, get_model, is_architecture,
                                        register_architecture)

__all__ = ["ARCHITECTURES", "ArchSpec", "ArchitectureChoices", "CIFAR_MEAN", "CIFAR_STD",
           "CNN", "CNNExtractor", "Classifier", "GatingNetwork", "HETEROGENEOUS", "Header",
           "MODEL_CHOICES", "SN_STATISTICS", "SwitchableNorm", "arch_spec",
           "check_architectures", "classify", "client_archs", "count_params", "extract",
           "get_extractor", "get_model", "is_architecture", "normalize",
           "register_architecture"]
