"""Importers: public benchmarks written as Harbor benchmark directories (``rsigym benchmarks import``)."""
