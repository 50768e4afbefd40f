from .data_manager import DataManager, DatasetWrapper, build_data_loader, stop_loader_workers

__all__ = ["DataManager", "DatasetWrapper", "build_data_loader", "stop_loader_workers"]
