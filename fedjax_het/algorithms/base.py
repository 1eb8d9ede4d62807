"""The names of ``api`` (the contract) and ``rounds`` (the machinery) under one roof.

Kept for code written against the single module they came from (the deployment, the
benchmarks); new code imports ``fedjax_het.algorithms.api`` and, for a custom round,
``fedjax_het.algorithms.rounds``.
"""
from __future__ import annotations

from fedjax_het.algorithms.api import AggregateFn
from fedjax_het.algorithms.api import Algorithm
from fedjax_het.algorithms.api import ClientState
from fedjax_het.algorithms.api import ClientUpdateFn
from fedjax_het.algorithms.api import CommunicationFn
from fedjax_het.algorithms.api import DownlinkFn
from fedjax_het.algorithms.api import InitClientFn
from fedjax_het.algorithms.api import InitServerFn
from fedjax_het.algorithms.api import PredictFn
from fedjax_het.algorithms.api import Protocol
from fedjax_het.algorithms.api import PyTree
from fedjax_het.algorithms.api import Runtime
from fedjax_het.algorithms.api import ServerDataFn
from fedjax_het.algorithms.api import Spec
from fedjax_het.algorithms.api import State
from fedjax_het.algorithms.api import TrainedPayloadFn
from fedjax_het.algorithms.api import clip
from fedjax_het.algorithms.api import count_params
from fedjax_het.algorithms.api import download
from fedjax_het.algorithms.api import dummy_input
from fedjax_het.algorithms.api import own_upload
from fedjax_het.algorithms.api import sgd
from fedjax_het.algorithms.api import sgd_args
from fedjax_het.algorithms.api import whole_server
from fedjax_het.algorithms.rounds import GroupRound
from fedjax_het.algorithms.rounds import advance
from fedjax_het.algorithms.rounds import aggregate_groups
from fedjax_het.algorithms.rounds import client_init_keys
from fedjax_het.algorithms.rounds import evaluate_groups
from fedjax_het.algorithms.rounds import from_protocol
from fedjax_het.algorithms.rounds import group_draw
from fedjax_het.algorithms.rounds import group_witness
from fedjax_het.algorithms.rounds import init_clients
from fedjax_het.algorithms.rounds import keys_of_round
from fedjax_het.algorithms.rounds import own_computation
from fedjax_het.algorithms.rounds import protocol_evaluate
from fedjax_het.algorithms.rounds import protocol_init
from fedjax_het.algorithms.rounds import protocol_round
from fedjax_het.algorithms.rounds import round_keys
from fedjax_het.algorithms.rounds import round_metrics
from fedjax_het.algorithms.rounds import sampled_accuracy
from fedjax_het.algorithms.rounds import stand_ins
from fedjax_het.algorithms.rounds import train_group
from fedjax_het.algorithms.rounds import train_protocol_groups

__all__ = ['AggregateFn', 'Algorithm', 'ClientState', 'ClientUpdateFn', 'CommunicationFn', 'DownlinkFn', 'GroupRound', 'InitClientFn', 'InitServerFn', 'PredictFn', 'Protocol', 'PyTree', 'Runtime', 'ServerDataFn', 'Spec', 'State', 'TrainedPayloadFn', 'advance', 'aggregate_groups', 'client_init_keys', 'clip', 'count_params', 'download', 'dummy_input', 'evaluate_groups', 'from_protocol', 'group_draw', 'group_witness', 'init_clients', 'keys_of_round', 'own_computation', 'own_upload', 'protocol_evaluate', 'protocol_init', 'protocol_round', 'round_keys', 'round_metrics', 'sampled_accuracy', 'sgd', 'sgd_args', 'stand_ins', 'train_group', 'train_protocol_groups', 'whole_server']
