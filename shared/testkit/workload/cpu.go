package workload

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// CPU is the CPU time spent during a window, by whom, read from the
// kernel (getrusage, /proc): on a machine whose cores every process of a
// run shares, it says which of them the cores went to.
type CPU struct {
	// Wall is the window's length; Cores the machine's CPUs.
	Wall  time.Duration
	Cores int
	// Children is the processes this one started and waited for in the
	// window (the function bootstraps: getrusage RUSAGE_CHILDREN, so a
	// process counts once it has ended); Self this process (the target,
	// the producers, the emulator).
	Children, Self time.Duration
	// Database is the server processes of one database (its backends and
	// autovacuum workers, from pg_stat_activity, each read from
	// /proc/<pid>/stat every DatabaseSampleEvery while it lives, so a
	// backend's last fraction of a period before it ends is missed); zero
	// when the server is not on this machine. The server's shared
	// processes (WAL writer, checkpointer) are not in it.
	Database time.Duration
	// DatabaseKnown says whether the database's processes could be read.
	DatabaseKnown bool
	// Machine is every CPU's busy time (/proc/stat: all but idle and
	// iowait), whoever spent it: other work on the machine included.
	Machine time.Duration
}

// Busy is the share of the machine's capacity (Cores × Wall) that t is.
func (c CPU) Busy(t time.Duration) float64 {
	if c.Wall <= 0 || c.Cores == 0 {
		return 0
	}
	return t.Seconds() / (c.Wall.Seconds() * float64(c.Cores))
}

// DatabaseSampleEvery is how often a CPUMeter reads the database's
// processes.
const DatabaseSampleEvery = 250 * time.Millisecond

// CPUMeter measures a CPU window. Start one, run the work, Stop it after
// the processes to count have ended.
type CPUMeter struct {
	start                 time.Time
	children, self, busy  time.Duration
	stop                  context.CancelFunc
	done                  chan struct{}
	mu                    sync.Mutex
	backends              map[int]backendCPU
	databaseKnown, failed bool
}

type backendCPU struct{ first, last time.Duration }

// StartCPUMeter starts a window; admin, when not nil, is a pool on the
// server used to list database's processes.
func StartCPUMeter(admin *pgxpool.Pool, database string) *CPUMeter {
	m := &CPUMeter{start: time.Now(), backends: map[int]backendCPU{}, done: make(chan struct{})}
	m.children, m.self = rusage()
	m.busy = machineBusy()
	ctx, cancel := context.WithCancel(context.Background())
	m.stop = cancel
	go func() {
		defer close(m.done)
		if admin == nil {
			return
		}
		t := time.NewTicker(DatabaseSampleEvery)
		defer t.Stop()
		for {
			m.sample(ctx, admin, database)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return m
}

func (m *CPUMeter) sample(ctx context.Context, admin *pgxpool.Pool, database string) {
	rows, err := admin.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, database)
	if err != nil {
		return
	}
	var pids []int
	for rows.Next() {
		var pid int
		if rows.Scan(&pid) == nil {
			pids = append(pids, pid)
		}
	}
	rows.Close()
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, pid := range pids {
		t, ok := processCPU(pid)
		if !ok {
			continue
		}
		m.databaseKnown = true
		b, seen := m.backends[pid]
		if !seen {
			// A process already running when the window opened counts
			// from its first reading, one started since from its start.
			if time.Since(m.start) < 2*DatabaseSampleEvery {
				b.first = t
			}
		}
		b.last = t
		m.backends[pid] = b
	}
}

// Stop closes the window. Call it once the processes to count as
// Children have been waited for.
func (m *CPUMeter) Stop(ctx context.Context, admin *pgxpool.Pool, database string) CPU {
	m.stop()
	<-m.done
	if admin != nil {
		m.sample(ctx, admin, database)
	}
	children, self := rusage()
	c := CPU{
		Wall: time.Since(m.start), Cores: runtime.NumCPU(),
		Children: children - m.children, Self: self - m.self, Machine: machineBusy() - m.busy,
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	c.DatabaseKnown = m.databaseKnown
	for _, b := range m.backends {
		c.Database += b.last - b.first
	}
	return c
}

func rusage() (children, self time.Duration) {
	var ch, s syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ch)
	syscall.Getrusage(syscall.RUSAGE_SELF, &s)
	tv := func(t syscall.Timeval) time.Duration { return time.Duration(t.Nano()) }
	return tv(ch.Utime) + tv(ch.Stime), tv(s.Utime) + tv(s.Stime)
}

// clockTick is the kernel's USER_HZ, in which /proc reports CPU times: 100
// on every Linux architecture Go supports.
const clockTick = 10 * time.Millisecond

// processCPU is a process's user and system time (/proc/<pid>/stat,
// fields 14 and 15).
func processCPU(pid int) (time.Duration, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	// The command name (field 2) may hold spaces; the fields after its
	// closing parenthesis start at field 3.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, false
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(utime+stime) * clockTick, true
}

// machineBusy is the time every CPU spent on anything but idling
// (/proc/stat's first line: user, nice, system, irq, softirq, steal).
func machineBusy() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 9 || f[0] != "cpu" {
		return 0
	}
	var busy int64
	for i, v := range f[1:9] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		busy += n
	}
	return time.Duration(busy) * clockTick
}
