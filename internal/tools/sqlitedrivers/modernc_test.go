package sqlitedrivers

import (
	"database/sql"

	_ "modernc.org/sqlite" // database/sql driver "sqlite"
)

func init() {
	drivers = append(drivers, driverCase{name: "modernc", open: func(path string) (*sql.DB, error) {
		return sql.Open("sqlite", "file:"+path+"?_txlock=immediate")
	}})
}
