"""Datasets as LightningDataModules, read exactly as their releases are downloaded."""
