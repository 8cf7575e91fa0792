package emf

// Unit is a CloudWatch metric unit: the MetricDatum enumeration, the only
// values the Embedded Metric Format accepts.
type Unit string

// The CloudWatch units.
const (
	Seconds      Unit = "Seconds"
	Microseconds Unit = "Microseconds"
	Milliseconds Unit = "Milliseconds"

	Bytes     Unit = "Bytes"
	Kilobytes Unit = "Kilobytes"
	Megabytes Unit = "Megabytes"
	Gigabytes Unit = "Gigabytes"
	Terabytes Unit = "Terabytes"
	Bits      Unit = "Bits"
	Kilobits  Unit = "Kilobits"
	Megabits  Unit = "Megabits"
	Gigabits  Unit = "Gigabits"
	Terabits  Unit = "Terabits"

	Percent Unit = "Percent"
	Count   Unit = "Count"
	None    Unit = "None"

	BytesPerSecond     Unit = "Bytes/Second"
	KilobytesPerSecond Unit = "Kilobytes/Second"
	MegabytesPerSecond Unit = "Megabytes/Second"
	GigabytesPerSecond Unit = "Gigabytes/Second"
	TerabytesPerSecond Unit = "Terabytes/Second"
	BitsPerSecond      Unit = "Bits/Second"
	KilobitsPerSecond  Unit = "Kilobits/Second"
	MegabitsPerSecond  Unit = "Megabits/Second"
	GigabitsPerSecond  Unit = "Gigabits/Second"
	TerabitsPerSecond  Unit = "Terabits/Second"
	CountPerSecond     Unit = "Count/Second"
)

// Units lists every valid unit, in the order of the CloudWatch documentation.
var Units = []Unit{
	Seconds, Microseconds, Milliseconds,
	Bytes, Kilobytes, Megabytes, Gigabytes, Terabytes,
	Bits, Kilobits, Megabits, Gigabits, Terabits,
	Percent, Count,
	BytesPerSecond, KilobytesPerSecond, MegabytesPerSecond, GigabytesPerSecond, TerabytesPerSecond,
	BitsPerSecond, KilobitsPerSecond, MegabitsPerSecond, GigabitsPerSecond, TerabitsPerSecond,
	CountPerSecond, None,
}

// Valid reports whether u is one of the CloudWatch units. The names are
// case-sensitive: "count" is not a unit, and CloudWatch would drop the
// whole document over it.
func (u Unit) Valid() bool {
	switch u {
	case Seconds, Microseconds, Milliseconds,
		Bytes, Kilobytes, Megabytes, Gigabytes, Terabytes,
		Bits, Kilobits, Megabits, Gigabits, Terabits,
		Percent, Count,
		BytesPerSecond, KilobytesPerSecond, MegabytesPerSecond, GigabytesPerSecond, TerabytesPerSecond,
		BitsPerSecond, KilobitsPerSecond, MegabitsPerSecond, GigabitsPerSecond, TerabitsPerSecond,
		CountPerSecond, None:
		return true
	}
	return false
}
