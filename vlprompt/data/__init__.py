from .data_manager import DataManager, DatasetWrapper, build_data_loader

__all__ = ["DataManager", "DatasetWrapper", "build_data_loader"]
