"""How a stream's keys are split into partitions, as a pipeline declares it (the graph
imports this; ``partitions.py`` runs it)."""

from __future__ import annotations

import attrs

from headrace.pipeline.errors import PipelineError


@attrs.frozen(slots=True)
class Partitioning:
    """``count`` partitions; ``subject`` the filter of one, with ``{partition}`` where its
    number goes (``"clicks.{partition}.>"``)."""

    count: int = attrs.field(validator=attrs.validators.ge(1))
    subject: str = attrs.field()

    @subject.validator
    def _has_partition(self, _attribute: attrs.Attribute[str], value: str) -> None:
        if "{partition}" not in value:
            raise PipelineError(
                f"a partition's subject needs '{{partition}}' where its number goes: {value!r}"
            )

    def subject_of(self, partition: int) -> str:
        return self.subject.format(partition=partition)
